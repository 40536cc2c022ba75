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

// CronOption configures a Cron.
type CronOption func(*Cron)

// WithCronClock makes the Cron read time and wait on timers from clk (tests pass a clockwork.FakeClock).
// The default is the real clock, with Now taken from the Warmer's Config.Now.
func WithCronClock(clk clockwork.Clock) CronOption { return func(c *Cron) { c.clk = clk } }

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
type Cron struct {
	w   *Warmer
	rec RunRecorder
	log *slog.Logger
	m   cronMetrics
	clk clockwork.Clock

	updates chan map[string]*schedEntry

	mu      sync.Mutex
	scheds  map[string]*schedEntry
	running map[string]bool // names with a run in progress on this daemon (kept across reloads)
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
func NewCron(w *Warmer, rec RunRecorder, reg prometheus.Registerer, log *slog.Logger, opts ...CronOption) (*Cron, error) {
	if log == nil {
		log = slog.Default()
	}
	c := &Cron{w: w, rec: rec, log: log, updates: make(chan map[string]*schedEntry, 1), scheds: map[string]*schedEntry{},
		running: map[string]bool{}, clk: warmerClock{Clock: clockwork.NewRealClock(), now: w.now}}
	for _, o := range opts {
		o(c)
	}
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

// warmerClock is the real clock with Now from the Warmer's Config.Now, so that Cron and Warmer read one clock.
type warmerClock struct {
	clockwork.Clock
	now func() time.Time
}

func (c warmerClock) Now() time.Time { return c.now() }

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
// progress is not started again by the reload: the run goes on, and the new entry skips while it does.
func (c *Cron) Update(scheds []ScheduleConfig) error {
	next, err := c.parse(scheds)
	if err != nil {
		return err
	}
	select {
	case <-c.updates:
	default:
	}
	c.updates <- next
	return nil
}

// Run fires the schedules and blocks until ctx ends; then it stops starting runs, interrupts runs in progress
// (their locks are released, and their records say interrupted) and waits for them.
func (c *Cron) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	// Apply a pending Update before the first firing.
	select {
	case next := <-c.updates:
		c.apply(next)
	default:
	}
	for {
		now := c.clk.Now()
		var wake time.Time
		c.mu.Lock()
		for name, e := range c.scheds {
			if e.next.IsZero() {
				c.plan(e, now)
			}
			// Fire a due entry once, then plan from now: after a pause (a suspended process) the missed
			// times are not run one after the other.
			if !e.next.IsZero() && !e.next.After(now) {
				at, wall, gap := e.next, e.wall, e.gap
				c.plan(e, now)
				if gap && e.cfg.SkipDSTGap {
					c.log.Warn("schedule: a daylight-saving change skipped this run's local time; not running it (set dst_gap = \"run\" to run it after the gap)",
						"schedule", name, "skipped_local_time", wall.Format("2006-01-02 15:04:05"), "zone", e.spec.loc.String())
					c.m.runs.WithLabelValues(name, "skipped_dst").Inc()
					e.last, e.lastR = at, "skipped_dst"
				} else if c.running[name] {
					c.log.Info("schedule: previous run still in progress; skipping this time", "schedule", name,
						"scheduled", at)
					c.m.runs.WithLabelValues(name, "skipped_running").Inc()
				} else {
					if gap {
						c.log.Warn("schedule: a daylight-saving change skipped this run's local time; running it now, right after the gap (dst_gap = \"run\")",
							"schedule", name, "skipped_local_time", wall.Format("2006-01-02 15:04:05"), "zone", e.spec.loc.String())
					}
					c.running[name] = true
					wg.Add(1)
					go func() {
						defer wg.Done()
						c.runScheduled(ctx, name, at, wall)
					}()
				}
			}
			if !e.next.IsZero() && (wake.IsZero() || e.next.Before(wake)) {
				wake = e.next
			}
		}
		c.mu.Unlock()
		var fire <-chan time.Time
		var timer clockwork.Timer
		if !wake.IsZero() {
			timer = c.clk.NewTimer(wake.Sub(now))
			fire = timer.Chan()
		}
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return nil
		case next := <-c.updates:
			c.apply(next)
		case <-fire:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// plan sets e's next firing: the spec's first activation after t, or, when a daylight-saving gap before it
// skips a time the spec names, the end of that gap (run or only logged, per SkipDSTGap). c.mu is held.
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
func (c *Cron) apply(next map[string]*schedEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, old := range c.scheds {
		n, ok := next[name]
		if !ok {
			c.deleteSeries(name)
			continue
		}
		n.last, n.lastR = old.last, old.lastR
		if n.spec.String() == old.spec.String() && n.cfg.SkipDSTGap == old.cfg.SkipDSTGap {
			n.next, n.wall, n.gap = old.next, old.wall, old.gap
		}
	}
	c.scheds = next
}

// deleteSeries removes a schedule's metric series. c.mu is held.
func (c *Cron) deleteSeries(name string) {
	c.m.runs.DeletePartialMatch(prometheus.Labels{"schedule": name})
	c.m.last.DeleteLabelValues(name)
	c.m.written.DeleteLabelValues(name)
}

// runScheduled runs schedule name for the time at (wall: that time's wall clock in the schedule's zone), if
// no replica has claimed it. c.running[name] was set by the caller.
func (c *Cron) runScheduled(ctx context.Context, name string, at, wall time.Time) {
	c.mu.Lock()
	e := c.scheds[name]
	c.mu.Unlock()
	result := "failed"
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("schedule: run panicked", "schedule", name, "error", fmt.Errorf("panic: %v", r))
			c.count(name, "failed", 0)
		}
		c.mu.Lock()
		delete(c.running, name)
		if cur := c.scheds[name]; cur != nil {
			cur.last, cur.lastR = c.clk.Now(), result
		}
		c.mu.Unlock()
	}()
	if e == nil {
		return
	}
	result = c.runOnce(ctx, e.cfg, at, wall)
}

// count records one run's result, unless the schedule was removed meanwhile (its series are gone for good).
func (c *Cron) count(name, result string, written int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.scheds[name] == nil {
		return
	}
	c.m.runs.WithLabelValues(name, result).Inc()
	if result != "skipped" {
		c.m.last.WithLabelValues(name).Set(float64(c.clk.Now().Unix()))
		c.m.written.WithLabelValues(name).Add(float64(written))
	}
}

// runOnce claims the scheduled time for cfg across the fleet and, if this replica won, runs and records the
// warmup. It returns the run's result label.
func (c *Cron) runOnce(ctx context.Context, cfg ScheduleConfig, at, wall time.Time) string {
	host, _ := os.Hostname()
	ok, err := c.w.rdb.SetNX(ctx, ClaimKey(cfg.Name, wall), host, CronClaimTTL).Result()
	if err != nil {
		c.log.Error("schedule: cannot claim its run; skipping it", "schedule", cfg.Name, "scheduled", at, "error", err)
		c.count(cfg.Name, "failed", 0)
		return "failed"
	}
	if !ok {
		c.log.Debug("schedule: another replica (or an earlier instant of a repeated local time) ran this time",
			"schedule", cfg.Name, "scheduled", at)
		c.count(cfg.Name, "skipped", 0)
		return "skipped"
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
	result := RunStatus(res, err)
	c.count(cfg.Name, result, res.Written)
	c.log.Info("schedule: warmup done", "schedule", cfg.Name, "result", result, "requested", res.Requested,
		"written", res.Written, "skipped_locked", res.SkippedLocked, "missing", res.Missing, "failed", res.Failed,
		"duration", res.Duration, "error", errors.Join(err, res.FirstError))
	return result
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

// Status returns each schedule's next and last run, by name.
func (c *Cron) Status() []ScheduleStatus {
	now := c.clk.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]ScheduleStatus, 0, len(c.scheds))
	for name, e := range c.scheds {
		st := ScheduleStatus{Name: name, Keyspace: e.cfg.Keyspace, Spec: e.cfg.Spec, Next: e.next, Last: e.last,
			LastResult: e.lastR}
		if st.Next.IsZero() {
			st.Next = e.spec.Next(now)
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b ScheduleStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}
