package warmer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
)

// CronClaimTTL is how long the fleet-wide claim on one scheduled time lives: longer than any run, and longer
// than the hour a daylight-saving change repeats, so no replica and no repeated local time runs it again.
const CronClaimTTL = 25 * time.Hour

// ScheduleConfig is one [[schedule]]: a warmup that runs at the times its cron spec names.
type ScheduleConfig struct {
	Name string // unique; a bounded metric label
	// Spec is the cron spec as written, time zone folded in ("CRON_TZ=Europe/Paris 0 30 7 * * mon-fri"). It
	// is parsed with ParseCron only when Cron is nil.
	Spec string
	// Cron is the parsed Spec. The daemon parses each spec once, when it loads the config, and passes it here.
	Cron     *CronSchedule
	Keyspace string   // must be one of the Warmer's keyspaces
	IDs      IDSource // the ids to warm at each run
	Spread   time.Duration
	Rate     float64
	// SkipDSTGap is what happens when a daylight-saving change skips a local time the spec names (02:30 on a
	// spring-forward night in Europe/Berlin). Default false: that time's warmup runs at the first valid time
	// after the gap (03:00) and is logged at WARN, as cronie and Vixie cron do, so a pre-promotion warmup is never
	// silently lost. True: the run is skipped, logged at WARN and counted as result "skipped_dst", as
	// robfig/cron alone does (robfig/cron PR #541). The daemon's dst_gap maps onto it ("skip": true).
	SkipDSTGap bool
}

// ScheduleStatus is one schedule's state for the status page and `keepwarm status`.
type ScheduleStatus struct {
	Name       string    `json:"name"`
	Keyspace   string    `json:"keyspace"`
	Spec       string    `json:"spec"`
	Next       time.Time `json:"next"`
	Last       time.Time `json:"last"`        // zero before the first run on this daemon
	LastResult string    `json:"last_result"` // ok, failed, interrupted, skipped (another replica ran it) or skipped_dst
}

// Cron runs [[schedule]] warmups inside the daemon. Each scheduled time runs once across the fleet: the first
// replica to claim "keepwarm:cron:<name>:<wall-clock time>" in Redis (SET NX, CronClaimTTL) runs it, the
// others skip it. A schedule whose previous run is still going skips the new time (as robfig/cron's
// SkipIfStillRunning), and a panicking run is recovered and counted as failed.
//
// Daylight-saving time, in the schedule's own zone (CRON_TZ=, else the host's): a local time that a change
// repeats (02:30 on the fall-back night in Europe/Berlin) fires twice, but both instants claim the same key,
// built from the wall-clock time in the schedule's zone, so it runs once. A local time that a change skips
// (02:30 on the spring-forward night) does not exist: by default that run happens at the first valid time after
// the gap (cronie's behaviour), logged; with ScheduleConfig.SkipDSTGap it is skipped and logged.
//
// Concurrency: as in robfig/cron's run(), one goroutine owns the schedules (a *cronState). While Run runs, that
// is Run's loop: Update and Status send it their operation over a channel, and each run reports its result back
// over another. While Run does not run, the state waits in a channel of one, and Update or Status takes it for
// the time of its operation. There is no mutex. Cron reads time and waits on timers from the Warmer's
// Config.Clock.
type Cron struct {
	w   *Warmer
	rec RunRecorder
	log *slog.Logger
	m   cronMetrics
	clk clockwork.Clock

	idle chan *cronState       // holds the state while Run does not run (capacity 1)
	ops  chan func(*cronState) // operations for Run's loop (Update, Status)
	done chan runDone          // one per run started by Run's loop, when the run ends

	// fired, when not nil, is called on the owner of the state for each firing counted in
	// keepwarm_schedule_runs_total, with its result; tests set it before Run to wait on firings.
	fired func(schedule, result string)
}

// cronState is what Cron's owner holds: the schedules and the runs in progress.
type cronState struct {
	scheds  map[string]*schedEntry
	running map[string]bool // names with a run in progress on this daemon (kept across reloads)
}

// runDone is one finished run's report to Run's loop.
type runDone struct {
	name    string
	result  string
	written int64
}

type schedEntry struct {
	cfg   ScheduleConfig
	spec  *CronSchedule
	next  time.Time // when the next firing is due; zero until planned
	wall  time.Time // the wall-clock time (CronSchedule.wall) that firing is for
	gap   bool      // the firing is a time a DST change skipped
	last  time.Time
	lastR string
}

type cronMetrics struct {
	runs    *prometheus.CounterVec
	last    *prometheus.GaugeVec
	written *prometheus.CounterVec
}

// NewCron returns a Cron for w's keyspaces; rec may be nil (runs are then not recorded). Its metrics are
// keepwarm_schedule_runs_total{schedule,result}, keepwarm_schedule_last_run_timestamp_seconds{schedule} and
// keepwarm_schedule_keys_written_total{schedule}; a schedule removed by Update loses its series.
func NewCron(w *Warmer, rec RunRecorder, reg prometheus.Registerer, log *slog.Logger) (*Cron, error) {
	if log == nil {
		log = slog.Default()
	}
	c := &Cron{w: w, rec: rec, log: log, clk: w.cfg.Clock, idle: make(chan *cronState, 1),
		ops: make(chan func(*cronState)), done: make(chan runDone)}
	c.idle <- &cronState{scheds: map[string]*schedEntry{}, running: map[string]bool{}}
	c.m = cronMetrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_schedule_runs_total",
			Help: "Scheduled warmup runs, by schedule and result (ok, failed, interrupted, skipped: another replica ran it, skipped_running: the previous run was still going, skipped_dst: a daylight-saving change skipped the local time).",
		}, []string{"schedule", "result"}),
		last: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keepwarm_schedule_last_run_timestamp_seconds",
			Help: "Unix time when the schedule's last run on this daemon finished.",
		}, []string{"schedule"}),
		written: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_schedule_keys_written_total",
			Help: "Keys written by scheduled warmups.",
		}, []string{"schedule"}),
	}
	if reg != nil {
		for _, col := range []prometheus.Collector{c.m.runs, c.m.last, c.m.written} {
			if err := reg.Register(col); err != nil {
				return nil, fmt.Errorf("warmer: register cron metrics: %w", err)
			}
		}
	}
	return c, nil
}

// parse checks scheds: names unique, specs valid, keyspaces known. The error names each bad schedule. A spec
// already parsed (ScheduleConfig.Cron) is not parsed again.
func (c *Cron) parse(scheds []ScheduleConfig) (map[string]*schedEntry, error) {
	out := make(map[string]*schedEntry, len(scheds))
	var errs []error
	known := c.w.Keyspaces()
	for _, s := range scheds {
		spec := s.Cron
		var err error
		if spec == nil {
			spec, err = ParseCron(s.Spec)
		}
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("schedule %q: cron: %w", s.Name, err))
		case out[s.Name] != nil:
			errs = append(errs, fmt.Errorf("schedule %q: name: duplicate", s.Name))
		case !slices.Contains(known, s.Keyspace):
			errs = append(errs, fmt.Errorf("schedule %q: keyspace: %q is not configured", s.Name, s.Keyspace))
		case s.IDs == nil:
			errs = append(errs, fmt.Errorf("schedule %q: ids: none", s.Name))
		case s.Spread < 0 || s.Spread > MaxDuration:
			errs = append(errs, fmt.Errorf("schedule %q: spread: %v is not in [0, %v]", s.Name, s.Spread, MaxDuration))
		default:
			s.Spec = spec.String()
			out[s.Name] = &schedEntry{cfg: s, spec: spec}
		}
	}
	return out, errors.Join(errs...)
}

// Update replaces the schedules. It validates first and changes nothing on error. A schedule whose run is in
// progress is not started again by the reload: the run goes on, and the new entry skips while it does. When
// Update returns, the new schedules are in place (Status shows them).
func (c *Cron) Update(scheds []ScheduleConfig) error {
	next, err := c.parse(scheds)
	if err != nil {
		return err
	}
	// The owner runs an operation at once and does no I/O, so this cannot wait long: no context is needed.
	return c.do(context.Background(), func(st *cronState) { c.apply(st, next) })
}

// do runs op with the state: on Run's loop while Run runs, else here, holding the state meanwhile. It returns
// when op has run, or ctx's error if ctx ends first; op may then still run later, so it must send its results
// on a buffered channel that only a caller which got no error reads.
func (c *Cron) do(ctx context.Context, op func(*cronState)) error {
	ran := make(chan struct{})
	select {
	case st := <-c.idle:
		defer func() { c.idle <- st }()
		op(st)
		return nil
	case c.ops <- func(st *cronState) { op(st); close(ran) }:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-ran:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run fires the schedules and blocks until ctx ends; then it stops starting runs, interrupts runs in progress
// (their locks are released, and their records say interrupted) and waits for them. Only one Run runs at a
// time: a second one waits for the first to return.
func (c *Cron) Run(ctx context.Context) error {
	var st *cronState
	select {
	case st = <-c.idle:
	case <-ctx.Done():
		return nil
	}
	defer func() { c.idle <- st }()
	for {
		now := c.clk.Now()
		wake := c.fireDue(ctx, st, now)
		var fire <-chan time.Time
		var timer clockwork.Timer
		if !wake.IsZero() {
			timer = c.clk.NewTimer(wake.Sub(now))
			fire = timer.Chan()
		}
		select {
		case <-ctx.Done():
		case op := <-c.ops:
			op(st)
		case r := <-c.done:
			c.finish(st, r)
		case <-fire:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			// The runs in progress see ctx end too; wait for their reports, serving operations meanwhile.
			for len(st.running) > 0 {
				select {
				case op := <-c.ops:
					op(st)
				case r := <-c.done:
					c.finish(st, r)
				}
			}
			return nil
		}
	}
}

// fireDue starts the runs that are due at now and returns when the next firing is due (zero: none is).
func (c *Cron) fireDue(ctx context.Context, st *cronState, now time.Time) (wake time.Time) {
	for name, e := range st.scheds {
		if e.next.IsZero() {
			c.plan(e, now)
		}
		// Fire a due entry once, then plan from now: after a pause (a suspended process) the missed
		// times are not run one after the other.
		if !e.next.IsZero() && !e.next.After(now) {
			at, wall, gap := e.next, e.wall, e.gap
			c.plan(e, now)
			switch {
			case gap && e.cfg.SkipDSTGap:
				c.log.Warn("schedule: a daylight-saving change skipped this run's local time; not running it (set dst_gap = \"run\" to run it after the gap)",
					"schedule", name, "skipped_local_time", wall.Format("2006-01-02 15:04:05"), "zone", e.spec.loc.String())
				e.last, e.lastR = at, "skipped_dst"
				c.counted(name, "skipped_dst")
			case st.running[name]:
				c.log.Info("schedule: previous run still in progress; skipping this time", "schedule", name,
					"scheduled", at)
				c.counted(name, "skipped_running")
			default:
				if gap {
					c.log.Warn("schedule: a daylight-saving change skipped this run's local time; running it now, right after the gap (dst_gap = \"run\")",
						"schedule", name, "skipped_local_time", wall.Format("2006-01-02 15:04:05"), "zone", e.spec.loc.String())
				}
				st.running[name] = true
				go c.runScheduled(ctx, e.cfg, at, wall)
			}
		}
		if !e.next.IsZero() && (wake.IsZero() || e.next.Before(wake)) {
			wake = e.next
		}
	}
	return wake
}

// plan sets e's next firing: the spec's first activation after t, or, when a daylight-saving gap before it
// skips a time the spec names, the end of that gap (run or only logged, per SkipDSTGap).
func (c *Cron) plan(e *schedEntry, t time.Time) {
	next := e.spec.Next(t)
	e.gap = false
	if next.IsZero() {
		e.next, e.wall = time.Time{}, time.Time{}
		return
	}
	e.next, e.wall = next, e.spec.wall(next)
	if skipped, end, ok := e.spec.gap(t, next); ok && end.After(t) {
		e.next, e.wall, e.gap = end, skipped, true
	}
}

// apply installs the parsed schedules: unchanged entries keep their next firing and their last run;
// removed ones lose their metric series.
func (c *Cron) apply(st *cronState, next map[string]*schedEntry) {
	for name, old := range st.scheds {
		n, ok := next[name]
		if !ok {
			c.m.runs.DeletePartialMatch(prometheus.Labels{"schedule": name})
			c.m.last.DeleteLabelValues(name)
			c.m.written.DeleteLabelValues(name)
			continue
		}
		n.last, n.lastR = old.last, old.lastR
		if n.spec.String() == old.spec.String() && n.cfg.SkipDSTGap == old.cfg.SkipDSTGap {
			n.next, n.wall, n.gap = old.next, old.wall, old.gap
		}
	}
	st.scheds = next
}

// runScheduled runs cfg's schedule for the time at (wall: that time's wall clock in the schedule's zone), if
// no replica has claimed it, and reports the result to Run's loop, which waits for the report.
func (c *Cron) runScheduled(ctx context.Context, cfg ScheduleConfig, at, wall time.Time) {
	r := runDone{name: cfg.Name, result: "failed"}
	defer func() {
		if p := recover(); p != nil {
			c.log.Error("schedule: run panicked", "schedule", cfg.Name, "error", fmt.Errorf("panic: %v", p))
		}
		c.done <- r
	}()
	r.result, r.written = c.runOnce(ctx, cfg, at, wall)
}

// finish takes a run's report: the schedule may run again, and the result is counted, unless the schedule
// was removed meanwhile (its series are gone for good).
func (c *Cron) finish(st *cronState, r runDone) {
	delete(st.running, r.name)
	e := st.scheds[r.name]
	if e == nil {
		return
	}
	e.last, e.lastR = c.clk.Now(), r.result
	if r.result != "skipped" {
		c.m.last.WithLabelValues(r.name).Set(float64(e.last.Unix()))
		c.m.written.WithLabelValues(r.name).Add(float64(r.written))
	}
	c.counted(r.name, r.result)
}

// counted counts one firing of schedule name with its result. The state's owner calls it.
func (c *Cron) counted(name, result string) {
	c.m.runs.WithLabelValues(name, result).Inc()
	if c.fired != nil {
		c.fired(name, result)
	}
}

// runOnce claims the scheduled time for cfg across the fleet and, if this replica won, runs and records the
// warmup. It returns the run's result label and the number of keys written; it counts nothing.
func (c *Cron) runOnce(ctx context.Context, cfg ScheduleConfig, at, wall time.Time) (result string, written int64) {
	host, _ := os.Hostname()
	ok, err := c.w.rdb.SetNX(ctx, ClaimKey(cfg.Name, wall), host, CronClaimTTL).Result()
	if err != nil {
		c.log.Error("schedule: cannot claim its run; skipping it", "schedule", cfg.Name, "scheduled", at, "error", err)
		return "failed", 0
	}
	if !ok {
		c.log.Debug("schedule: another replica (or an earlier instant of a repeated local time) ran this time",
			"schedule", cfg.Name, "scheduled", at)
		return "skipped", 0
	}
	var runID int64
	if c.rec != nil {
		if runID, err = c.rec.Start(ctx, cfg.Name, TriggerCron, cfg.Keyspace); err != nil {
			c.log.Warn("schedule: run not recorded", "schedule", cfg.Name, "error", err)
		}
	}
	c.log.Info("schedule: warmup starting", "schedule", cfg.Name, "keyspace", cfg.Keyspace, "scheduled", at)
	res, err := c.w.Warmup(ctx, cfg.Keyspace, cfg.IDs, WarmupOptions{Spread: cfg.Spread, Rate: cfg.Rate})
	if c.rec != nil && runID != 0 {
		if ferr := c.rec.Finish(ctx, runID, res, err); ferr != nil {
			c.log.Warn("schedule: run end not recorded", "schedule", cfg.Name, "error", ferr)
		}
	}
	result = RunStatus(res, err)
	c.log.Info("schedule: warmup done", "schedule", cfg.Name, "result", result, "requested", res.Requested,
		"written", res.Written, "skipped_locked", res.SkippedLocked, "missing", res.Missing, "failed", res.Failed,
		"duration", res.Duration, "error", errors.Join(err, res.FirstError))
	return result, res.Written
}

// ClaimKey is the Redis key that claims one scheduled time of a schedule for one replica:
// "keepwarm:cron:<name>:<t>", where t is scheduled's wall-clock time in scheduled's own location, written as
// Unix seconds as if it were UTC. Cron passes the time in the schedule's zone, so both instants of a local time
// that a DST change repeats map to the same key whatever the host's zone is.
func ClaimKey(name string, scheduled time.Time) string {
	y, mo, d := scheduled.Date()
	h, mi, s := scheduled.Clock()
	wall := time.Date(y, mo, d, h, mi, s, 0, time.UTC).Unix()
	return "keepwarm:cron:" + name + ":" + strconv.FormatInt(wall, 10)
}

// Status returns each schedule's next and last run, by name. It asks Run's loop while Run runs, and returns
// ctx's error if ctx ends before the loop answers.
func (c *Cron) Status(ctx context.Context) ([]ScheduleStatus, error) {
	reply := make(chan []ScheduleStatus, 1)
	if err := c.do(ctx, func(st *cronState) { reply <- c.snapshot(st) }); err != nil {
		return nil, err
	}
	return <-reply, nil
}

// snapshot is Status's answer, made by the state's owner.
func (c *Cron) snapshot(st *cronState) []ScheduleStatus {
	now := c.clk.Now()
	out := make([]ScheduleStatus, 0, len(st.scheds))
	for name, e := range st.scheds {
		s := ScheduleStatus{Name: name, Keyspace: e.cfg.Keyspace, Spec: e.cfg.Spec, Next: e.next, Last: e.last,
			LastResult: e.lastR}
		if s.Next.IsZero() {
			s.Next = e.spec.Next(now)
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b ScheduleStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}
