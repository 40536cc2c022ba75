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
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/robfig/cron/v3"
)

// CronParser parses [[schedule]] specs: robfig/cron syntax with optional seconds, descriptors (@daily,
// @every 10m) and a CRON_TZ=Zone prefix.
var CronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow |
	cron.Descriptor)

// CronClaimTTL is how long the fleet-wide claim on one scheduled time lives: longer than any run, and longer
// than the hour a daylight-saving change repeats, so no replica and no repeated local time runs it again.
const CronClaimTTL = 25 * time.Hour

// ScheduleConfig is one [[schedule]]: a warmup that runs at the times its cron spec names.
type ScheduleConfig struct {
	Name     string   // unique; a bounded metric label
	Spec     string   // cron spec for CronParser, time zone folded in ("CRON_TZ=Europe/Paris 0 30 7 * * mon-fri")
	Keyspace string   // must be one of the Warmer's keyspaces
	IDs      IDSource // the ids to warm at each run
	Spread   time.Duration
	Rate     float64
}

// RunRecorder records warmup runs (internal/runs writes them to keepwarm.warmup_runs).
type RunRecorder interface {
	Start(ctx context.Context, name, trigger, keyspace string) (int64, error)
	Finish(ctx context.Context, id int64, res WarmupResult, err error) error
}

// ScheduleStatus is one schedule's state for the status page and `keepwarm status`.
type ScheduleStatus struct {
	Name       string    `json:"name"`
	Keyspace   string    `json:"keyspace"`
	Spec       string    `json:"spec"`
	Next       time.Time `json:"next"`
	Last       time.Time `json:"last"`        // zero before the first run on this daemon
	LastResult string    `json:"last_result"` // ok, failed, interrupted, or skipped (claimed by another replica)
}

// Cron runs [[schedule]] warmups inside the daemon with robfig/cron v3, each wrapped in Recover and
// SkipIfStillRunning. Each scheduled time runs once across the fleet: the first replica to claim
// "keepwarm:cron:<name>:<wall-clock unix time>" in Redis (SET NX, CronClaimTTL) runs it, the others skip it.
//
// Daylight-saving time: a local time that a DST change skips (02:30 on a spring-forward night in
// America/New_York) does not exist, and robfig/cron skips it: there is no run that day. A local time that a
// change repeats (01:30 on a fall-back night) fires twice in robfig/cron; the claim key uses the wall-clock time,
// the same for both, so it runs once. Schedule warmups outside 01:00–03:00 local time, or in UTC, to avoid
// both cases.
type Cron struct {
	w   *Warmer
	rec RunRecorder
	log *slog.Logger
	m   cronMetrics

	updates chan []ScheduleConfig

	mu      sync.Mutex
	c       *cron.Cron
	scheds  map[string]*schedEntry
	running map[string]bool // names with a run in progress on this daemon (kept across reloads)
}

type schedEntry struct {
	cfg   ScheduleConfig
	spec  cron.Schedule
	id    cron.EntryID
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
// keepwarm_schedule_keys_written_total{schedule}.
func NewCron(w *Warmer, rec RunRecorder, reg prometheus.Registerer, log *slog.Logger) (*Cron, error) {
	if log == nil {
		log = slog.Default()
	}
	c := &Cron{w: w, rec: rec, log: log, updates: make(chan []ScheduleConfig, 1), scheds: map[string]*schedEntry{},
		running: map[string]bool{}}
	c.m = cronMetrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_schedule_runs_total",
			Help: "Scheduled warmup runs, by schedule and result (ok, failed, interrupted, skipped: another replica ran it).",
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

// parse checks scheds: names unique, specs valid, keyspaces known. The error names each bad schedule.
func (c *Cron) parse(scheds []ScheduleConfig) (map[string]*schedEntry, error) {
	out := make(map[string]*schedEntry, len(scheds))
	var errs []error
	known := c.w.Keyspaces()
	for _, s := range scheds {
		spec, err := CronParser.Parse(s.Spec)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("schedule %q: cron: %w", s.Name, err))
		case out[s.Name] != nil:
			errs = append(errs, fmt.Errorf("schedule %q: name: duplicate", s.Name))
		case !slices.Contains(known, s.Keyspace):
			errs = append(errs, fmt.Errorf("schedule %q: keyspace: %q is not configured", s.Name, s.Keyspace))
		case s.IDs == nil:
			errs = append(errs, fmt.Errorf("schedule %q: ids: none", s.Name))
		default:
			out[s.Name] = &schedEntry{cfg: s, spec: spec}
		}
	}
	return out, errors.Join(errs...)
}

// Update replaces the schedules. It validates first and changes nothing on error. A schedule whose run is in
// progress is not started again by the reload: the run goes on, and the new entry skips while it does.
func (c *Cron) Update(scheds []ScheduleConfig) error {
	if _, err := c.parse(scheds); err != nil {
		return err
	}
	select {
	case <-c.updates:
	default:
	}
	c.updates <- scheds
	return nil
}

// Run starts the schedules and blocks until ctx ends; then it stops starting runs, interrupts runs in progress
// (their locks are released, and their records say interrupted) and waits for them.
func (c *Cron) Run(ctx context.Context) error {
	c.mu.Lock()
	c.c = cron.New(cron.WithParser(CronParser), cron.WithLogger(cronLogger{c.log}))
	c.mu.Unlock()
	c.c.Start()
	for {
		select {
		case <-ctx.Done():
			<-c.c.Stop().Done()
			return nil
		case scheds := <-c.updates:
			if err := c.apply(ctx, scheds); err != nil {
				c.log.Error("schedules not applied", "error", err)
			}
		}
	}
}

// apply installs scheds in the running cron: unchanged entries stay, changed and removed ones are replaced.
func (c *Cron) apply(ctx context.Context, scheds []ScheduleConfig) error {
	next, err := c.parse(scheds)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, old := range c.scheds {
		if n, ok := next[name]; ok && n.cfg.Spec == old.cfg.Spec {
			// Same times: keep the entry (and so its SkipIfStillRunning state); runs read the new ids,
			// keyspace, spread and rate from c.scheds when they start.
			n.id, n.last, n.lastR = old.id, old.last, old.lastR
			continue
		}
		c.c.Remove(old.id)
	}
	for name, e := range next {
		if e.id != 0 {
			continue
		}
		if old, ok := c.scheds[name]; ok {
			e.last, e.lastR = old.last, old.lastR
		}
		job := cron.NewChain(cron.Recover(cronLogger{c.log}), cron.SkipIfStillRunning(cronLogger{c.log})).
			Then(cron.FuncJob(func() { c.runScheduled(ctx, name) }))
		e.id = c.c.Schedule(e.spec, job)
	}
	c.scheds = next
	return nil
}

// runScheduled runs schedule name for its latest scheduled time, if no replica has claimed it.
func (c *Cron) runScheduled(ctx context.Context, name string) {
	c.mu.Lock()
	e := c.scheds[name]
	if e == nil || c.running[name] {
		c.mu.Unlock()
		return
	}
	c.running[name] = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.running, name)
		c.mu.Unlock()
	}()
	scheduled := lastActivation(e.spec, time.Now())
	result := c.runOnce(ctx, e.cfg, scheduled)
	c.mu.Lock()
	if cur := c.scheds[name]; cur != nil {
		cur.last, cur.lastR = time.Now(), result
	}
	c.mu.Unlock()
}

// runOnce claims scheduled for cfg across the fleet and, if this replica won, runs and records the warmup. It
// returns the run's result label.
func (c *Cron) runOnce(ctx context.Context, cfg ScheduleConfig, scheduled time.Time) string {
	host, _ := os.Hostname()
	ok, err := c.w.rdb.SetNX(ctx, ClaimKey(cfg.Name, scheduled), host, CronClaimTTL).Result()
	if err != nil {
		c.log.Error("schedule: cannot claim its run; skipping it", "schedule", cfg.Name, "scheduled", scheduled, "error", err)
		c.m.runs.WithLabelValues(cfg.Name, "failed").Inc()
		return "failed"
	}
	if !ok {
		c.log.Debug("schedule: another replica runs this time", "schedule", cfg.Name, "scheduled", scheduled)
		c.m.runs.WithLabelValues(cfg.Name, "skipped").Inc()
		return "skipped"
	}
	var runID int64
	if c.rec != nil {
		if runID, err = c.rec.Start(ctx, cfg.Name, "cron", cfg.Keyspace); err != nil {
			c.log.Warn("schedule: run not recorded", "schedule", cfg.Name, "error", err)
		}
	}
	c.log.Info("schedule: warmup starting", "schedule", cfg.Name, "keyspace", cfg.Keyspace, "scheduled", scheduled)
	res, err := c.w.Warmup(ctx, cfg.Keyspace, cfg.IDs, WarmupOptions{Spread: cfg.Spread, Rate: cfg.Rate})
	if c.rec != nil && runID != 0 {
		if ferr := c.rec.Finish(ctx, runID, res, err); ferr != nil {
			c.log.Warn("schedule: run end not recorded", "schedule", cfg.Name, "error", ferr)
		}
	}
	result := "ok"
	switch {
	case res.Interrupted:
		result = "interrupted"
	case err != nil || res.Failed > 0:
		result = "failed"
	}
	c.m.runs.WithLabelValues(cfg.Name, result).Inc()
	c.m.last.WithLabelValues(cfg.Name).Set(float64(time.Now().Unix()))
	c.m.written.WithLabelValues(cfg.Name).Add(float64(res.Written))
	c.log.Info("schedule: warmup done", "schedule", cfg.Name, "result", result, "requested", res.Requested,
		"written", res.Written, "skipped_locked", res.SkippedLocked, "missing", res.Missing, "failed", res.Failed,
		"duration", res.Duration, "error", errors.Join(err, res.FirstError))
	return result
}

// ClaimKey is the Redis key that claims one scheduled time of a schedule for one replica:
// "keepwarm:cron:<name>:<t>", where t is the scheduled local wall-clock time written as Unix seconds (as if it
// were UTC). Both instants of a local time that a DST change repeats map to the same key.
func ClaimKey(name string, scheduled time.Time) string {
	y, mo, d := scheduled.Date()
	h, mi, s := scheduled.Clock()
	wall := time.Date(y, mo, d, h, mi, s, 0, time.UTC).Unix()
	return "keepwarm:cron:" + name + ":" + strconv.FormatInt(wall, 10)
}

// lastActivation returns the latest time at or before now that spec names (the time a job firing now is for),
// looking back at most one day; it returns now truncated to the second when there is none.
func lastActivation(spec cron.Schedule, now time.Time) time.Time {
	last := time.Time{}
	for t := spec.Next(now.Add(-24 * time.Hour)); !t.IsZero() && !t.After(now); t = spec.Next(t) {
		last = t
	}
	if last.IsZero() {
		return now.Truncate(time.Second)
	}
	return last
}

// Status returns each schedule's next and last run, by name.
func (c *Cron) Status() []ScheduleStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]ScheduleStatus, 0, len(c.scheds))
	for name, e := range c.scheds {
		st := ScheduleStatus{Name: name, Keyspace: e.cfg.Keyspace, Spec: e.cfg.Spec, Last: e.last, LastResult: e.lastR}
		if c.c != nil && e.id != 0 {
			st.Next = c.c.Entry(e.id).Next
		}
		if st.Next.IsZero() {
			st.Next = e.spec.Next(time.Now())
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b ScheduleStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// cronLogger adapts slog to robfig/cron's logger.
type cronLogger struct{ l *slog.Logger }

func (l cronLogger) Info(msg string, kv ...any) { l.l.Debug("cron: "+msg, kv...) }
func (l cronLogger) Error(err error, msg string, kv ...any) {
	l.l.Error("cron: "+msg, append(kv, "error", err)...)
}
