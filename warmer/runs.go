package warmer

import "context"

// Triggers: what started a warmup run (the values of keepwarm.warmup_runs.trigger).
const (
	TriggerCLI  = "cli"  // `keepwarm warmup`
	TriggerCron = "cron" // a [[schedule]]
	TriggerAPI  = "api"  // the HTTP API
)

// Run statuses: the values of keepwarm.warmup_runs.status, and the results of keepwarm_cron_runs_total for
// runs that ran.
const (
	RunRunning     = "running"
	RunOK          = "ok"
	RunFailed      = "failed"
	RunInterrupted = "interrupted"
)

// RunStatus is the status of a finished warmup run with result res and error err: RunInterrupted when it was
// interrupted, RunFailed when it failed as a whole or for any key, else RunOK.
func RunStatus(res WarmupResult, err error) string {
	switch {
	case res.Interrupted:
		return RunInterrupted
	case err != nil || res.Failed > 0:
		return RunFailed
	}
	return RunOK
}

// RunRecorder records warmup runs; internal/runs implements it with keepwarm.warmup_runs. trigger is one of the
// TriggerX values.
type RunRecorder interface {
	// Start records a run that begins and returns its id.
	Start(ctx context.Context, name, trigger, keyspace string) (int64, error)
	// Finish records the end of run id, with RunStatus(res, err).
	Finish(ctx context.Context, id int64, res WarmupResult, err error) error
}
