package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/benchload"
	"github.com/keepwarm/keepwarm/internal/redisserver"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/sources/postgres"
)

// The stampede scenario reproduces the harness of Jim Nelson's RedisConf 2017 talk "Preventing cache stampede
// with Redis & XFetch" (Internet Archive, stampede.php): 50 workers read one cached value with a 20 s expiry and
// a 500 ms recompute, each pausing a random 10–1000 ms before every read. Its published 5-minute results: naive
// cache-aside ("fetch") 484 misses, 471 of them simultaneous recomputes, in 290 s; XFetch plus lock ("xlocked")
// 0 misses, 17 recomputes, 36 lock contentions and 53 early recomputes in 317 s.

type stampedeConfig struct {
	services
	workers      int
	expiry       time.Duration
	recompute    time.Duration
	duration     time.Duration
	warmup       time.Duration
	pause        time.Duration
	lockTTL      time.Duration
	beta         float64
	jitter       float64
	refreshAhead time.Duration
	strategies   []stampedeStrategy
	quick        bool
	svg          string
	jsonPath     string
	seed         uint64
}

func stampedeFlagSet(c *stampedeConfig, stderr io.Writer) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("stampede", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.services.flags(fs)
	fs.IntVar(&c.workers, "workers", 50, "concurrent readers, each with its own client state (one app process each)")
	fs.DurationVar(&c.expiry, "expiry", 20*time.Second, "cache expiry (TTL) of the value")
	fs.DurationVar(&c.recompute, "recompute", 500*time.Millisecond, "recompute time δ: the origin query runs pg_sleep(δ) and returns the row")
	fs.DurationVar(&c.duration, "duration", 5*time.Minute, "measured time per strategy")
	fs.DurationVar(&c.warmup, "warmup", 5*time.Second, "reads before the measured window, not counted (stampede.php skips its first round too)")
	fs.DurationVar(&c.pause, "pause", time.Second, "each worker pauses uniformly in [10ms, pause] before every read (stampede.php's 10–1000 ms)")
	fs.DurationVar(&c.lockTTL, "lock-ttl", 10*time.Second, "lock TTL of every locking strategy")
	fs.Float64Var(&c.beta, "beta", 1, "XFetch β of xfetch, xlocked and lockstep")
	fs.Float64Var(&c.jitter, "jitter", lockstep.DefaultJitter, "TTL jitter of lockstep and keepwarm (written TTLs lie in [expiry, expiry×(1+jitter)))")
	fs.DurationVar(&c.refreshAhead, "refresh-ahead", 0, "the warmer's refresh_ahead (default 3×recompute; the warmer never uses less than 3× its measured rebuild p95)")
	strategies := fs.String("strategies", "all", "comma-separated strategies to run, in order: "+strategyNames()+", or all")
	fs.BoolVar(&c.quick, "quick", false, "the 20 s variant: --expiry 5s --recompute 200ms --duration 20s --warmup 3s (flags given explicitly win)")
	fs.StringVar(&c.svg, "svg", "", "write the recompute timeline plot (SVG) to this file")
	fs.StringVar(&c.jsonPath, "json", "", "write the results as JSON to this file")
	fs.Uint64Var(&c.seed, "seed", 1, "random seed of the workers' pauses")
	return fs, strategies
}

func strategyNames() string {
	var s []string
	for _, st := range stampedeStrategies {
		s = append(s, st.name)
	}
	return strings.Join(s, ",")
}

// parseStampede parses the stampede subcommand's flags.
func parseStampede(args []string, stderr io.Writer) (stampedeConfig, error) {
	var c stampedeConfig
	fs, strategies := stampedeFlagSet(&c, stderr)
	if err := parse(fs, args); err != nil {
		return c, err
	}
	if c.quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for name, v := range map[string]time.Duration{"expiry": 5 * time.Second, "recompute": 200 * time.Millisecond,
			"duration": 20 * time.Second, "warmup": 3 * time.Second} {
			if !set[name] {
				_ = fs.Set(name, v.String())
			}
		}
	}
	if c.refreshAhead == 0 {
		c.refreshAhead = 3 * c.recompute
	}
	switch {
	case c.workers < 1:
		return c, usageError{errors.New("--workers must be >= 1")}
	case c.expiry <= 0 || c.recompute <= 0 || c.duration <= 0 || c.warmup < 0:
		return c, usageError{errors.New("--expiry, --recompute and --duration must be > 0, --warmup >= 0")}
	case c.pause < 10*time.Millisecond:
		return c, usageError{errors.New("--pause must be >= 10ms")}
	case c.lockTTL <= c.recompute:
		return c, usageError{errors.New("--lock-ttl must exceed --recompute")}
	case c.refreshAhead >= c.expiry:
		return c, usageError{errors.New("--refresh-ahead must be below --expiry")}
	}
	if *strategies == "all" {
		*strategies = strategyNames()
	}
	for _, s := range strings.Split(*strategies, ",") {
		s = strings.TrimSpace(s)
		st, ok := strategyByName(s)
		if !ok {
			return c, usageError{fmt.Errorf("--strategies: unknown strategy %q (known: %s)", s, strategyNames())}
		}
		c.strategies = append(c.strategies, st)
	}
	return c, nil
}

func runStampede(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseStampede(args, stderr)
	if err != nil {
		return err
	}
	rep, err := stampede(ctx, c, stdout, stderr)
	if err != nil {
		return err
	}
	return writeResults(c.svg, c.jsonPath, rep, stampedeSVG, stderr)
}

// stampedeReport is the whole run.
type stampedeReport struct {
	Machine   machine          `json:"machine"`
	Started   time.Time        `json:"started"`
	Workers   int              `json:"workers"`
	Expiry    time.Duration    `json:"expiry_ns"`
	Recompute time.Duration    `json:"recompute_ns"`
	Duration  time.Duration    `json:"duration_ns"`
	Results   []stampedeResult `json:"results"`
}

// stampedeResult is one strategy's row.
type stampedeResult struct {
	Strategy         string         `json:"strategy"`
	Samples          int64          `json:"samples"`
	Hits             int64          `json:"hits"`
	Misses           int64          `json:"misses"`
	Recomputes       int64          `json:"recomputes"`
	DaemonRecomputes int64          `json:"daemon_recomputes"`
	Simultaneous     int64          `json:"simultaneous"`
	Contentions      int64          `json:"lock_contentions"`
	Early            int64          `json:"early_recomputes"`
	Ducked           int64          `json:"ducked_out"`
	Stale            int64          `json:"stale_serves"`
	Errors           int64          `json:"errors"`
	FirstError       string         `json:"first_error,omitempty"`
	Latency          latencySummary `json:"latency"`
	Baseline         latencySummary `json:"plain_hit_latency"`
	// Origin side, counted by PostgreSQL: rows the recompute query inserted into the log table during the window
	// (split by who ran it), recomputes that started while another one was still sleeping there, and the calls
	// pg_stat_statements counted for the query over the window.
	OriginApp     int64            `json:"origin_app"`
	OriginDaemon  int64            `json:"origin_daemon"`
	OriginOverlap int64            `json:"origin_overlapping"`
	OriginPGSS    int64            `json:"origin_pg_stat_statements"` // -1: extension not available
	Events        []recomputeEvent `json:"recomputes_timeline"`
	Window        [2]time.Time     `json:"window"`
	Daemon        map[string]int64 `json:"daemon_refreshes,omitempty"`
}

// recomputeEvent is one recompute (origin query) seen by the harness, At from the window's start.
type recomputeEvent struct {
	At     time.Duration `json:"at_ns"`
	Took   time.Duration `json:"took_ns"`
	Daemon bool          `json:"daemon"`
	Simul  bool          `json:"simultaneous"`
}

// origin runs recomputes and tracks how many are in flight, as stampede.php's INCR/DECR of its SIMUL key does.
type origin struct {
	inflight atomic.Int64
	mu       sync.Mutex
	events   []struct {
		at, took      time.Time
		daemon, simul bool
	}
}

func (o *origin) do(daemon bool, f func() error) error {
	start := time.Now()
	simul := o.inflight.Add(1) > 1
	err := f()
	o.inflight.Add(-1)
	o.mu.Lock()
	o.events = append(o.events, struct {
		at, took      time.Time
		daemon, simul bool
	}{start, time.Now(), daemon, simul})
	o.mu.Unlock()
	return err
}

// readOutcome is what one read saw, like stampede.php's exit-code bit field.
type readOutcome struct {
	miss, early, contention, ducked, stale bool
	err                                    error
}

type stampedeEnv struct {
	c       stampedeConfig
	run     string
	prefix  string
	app     *redis.Client // the workers' client
	base    *redis.Client // the plain-hit baseline readers' client
	daemon  *redis.Client // the warmer's client
	pool    *pgxpool.Pool // the apps' pool
	dpool   *pgxpool.Pool // the warmer's pool
	log     *slog.Logger
	stderr  io.Writer
	schema  string
	machine machine
	// checked, when set (tests), is called after each reference read's first look at the value, before it
	// decides to recompute or wait: a test knows then that the read saw the key as it was.
	checked func()
}

func stampede(ctx context.Context, c stampedeConfig, stdout, stderr io.Writer) (*stampedeReport, error) {
	e := &stampedeEnv{c: c, stderr: stderr, schema: c.schema, log: slog.New(slog.DiscardHandler)}
	e.run = strconv.FormatInt(time.Now().UnixNano(), 36)
	// Not "kwbench:": `keepwarm-bench warmup` deletes kwbench:* on the shared Redis when it starts.
	e.prefix = "kwbench-stampede:" + e.run + ":"
	var err error
	// Pool sizes: enough connections that the client pool never queues a read (50 workers, one read each).
	if e.app, err = benchload.NewRedis(ctx, c.redisURL, c.workers+10); err != nil {
		return nil, err
	}
	defer e.app.Close()
	if e.base, err = benchload.NewRedis(ctx, c.redisURL, c.workers+10); err != nil {
		return nil, err
	}
	defer e.base.Close()
	if e.daemon, err = benchload.NewRedis(ctx, c.redisURL, 0); err != nil {
		return nil, err
	}
	defer e.daemon.Close()
	if e.pool, err = benchload.NewPool(ctx, c.postgresURL, int32(c.workers+2)); err != nil {
		return nil, err
	}
	defer e.pool.Close()
	if e.dpool, err = benchload.NewPool(ctx, c.postgresURL, 4); err != nil {
		return nil, err
	}
	defer e.dpool.Close()
	if err := e.setupDB(ctx); err != nil {
		return nil, err
	}
	defer deletePrefix(e.app, e.prefix)

	e.machine = describeMachine(ctx, e.app, e.pool)
	rep := &stampedeReport{Machine: e.machine, Started: time.Now(), Workers: c.workers, Expiry: c.expiry,
		Recompute: c.recompute, Duration: c.duration}
	fmt.Fprintln(stdout, e.machine)
	fmt.Fprintf(stdout, "stampede: %d workers, expiry %v, recompute %v (pg_sleep), pause 10ms..%v, lock TTL %v, %v measured per strategy after a %v warm-up\n",
		c.workers, c.expiry, c.recompute, c.pause, c.lockTTL, c.duration, c.warmup)
	for _, st := range c.strategies {
		fmt.Fprintf(stderr, "stampede: running %s for %v (+%v warm-up)\n", st.name, c.duration, c.warmup)
		res, err := e.runStrategy(ctx, st)
		if err != nil {
			return nil, fmt.Errorf("strategy %s: %w", st.name, err)
		}
		rep.Results = append(rep.Results, *res)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	printStampede(stdout, rep)
	return rep, nil
}

// setupDB creates the value table and the recompute log, under an advisory lock so parallel runs do not race.
func (e *stampedeEnv) setupDB(ctx context.Context) error {
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	s := ident(e.schema)
	value := `{"id": 1, "name": "gnusto", "payload": "` + strings.Repeat("x", 240) + `"}`
	for _, q := range []string{
		"select pg_advisory_xact_lock(7734001)",
		"create schema if not exists " + s,
		"create table if not exists " + s + ".stampede_value (id text primary key, value text not null)",
		"create table if not exists " + s + ".stampede_log (run text not null, strategy text not null, source text not null, started timestamptz not null default clock_timestamp())",
		"create index if not exists stampede_log_run on " + s + ".stampede_log (run, strategy)",
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("set up %s: %w", q, err)
		}
	}
	if _, err := tx.Exec(ctx, "insert into "+s+".stampede_value values ('1', $1) on conflict (id) do update set value = excluded.value", value); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// originQuery is the recompute: it logs itself in the database, sleeps δ and returns the row. Its text is fixed
// per strategy and source; the values are ours, never user input.
func (e *stampedeEnv) originQuery(strategy, source string) string {
	s := ident(e.schema)
	return fmt.Sprintf(`with log as (insert into %s.stampede_log (run, strategy, source) values ('%s', '%s', '%s') returning 1)
select v.id, v.value from %s.stampede_value v, log, (select pg_sleep(%g)) d where v.id = any($1)`,
		s, e.run, strategy, source, s, e.c.recompute.Seconds())
}

func (e *stampedeEnv) source(pool *pgxpool.Pool, strategy, source string) (*postgres.Source, error) {
	return postgres.New(pool, postgres.Config{Keyspace: "stampede", Query: e.originQuery(strategy, source),
		StatementTimeout: e.c.lockTTL})
}

// pgssCalls returns the calls pg_stat_statements counted for the recompute query, or -1 without the extension.
func (e *stampedeEnv) pgssCalls(ctx context.Context) int64 {
	var n int64
	err := e.pool.QueryRow(ctx, `select coalesce(sum(s.calls), 0)::bigint from pg_stat_statements s
join pg_database d on d.oid = s.dbid where d.datname = current_database() and s.query like '%stampede_log (run%'`).Scan(&n)
	if err != nil {
		return -1
	}
	return n
}

type stampedeCounters struct {
	samples, hits, misses, contention, early, ducked, stale, errs atomic.Int64
	mu                                                            sync.Mutex
	firstErr                                                      error
}

// runStrategy is the harness: it runs st's readers, one per worker, each pausing 10ms..pause before every read,
// beside as many plain-hit baseline readers, for the warm-up and then the measured window, and returns what the
// window saw: the reads' outcomes and latencies, the recomputes the harness timed, and PostgreSQL's own log.
func (e *stampedeEnv) runStrategy(ctx context.Context, st stampedeStrategy) (*stampedeResult, error) {
	c := e.c
	name := st.name
	o := &origin{}
	appSrc, err := e.source(e.pool, name, "app")
	if err != nil {
		return nil, err
	}
	appLoad := benchload.LoaderOf(appSrc)
	recompute := func(ctx context.Context) ([]byte, error) {
		var v []byte
		err := o.do(false, func() error {
			var err error
			v, err = appLoad(ctx, "1")
			return err
		})
		return v, err
	}
	// Open the pools' connections before anything is timed.
	var warm sync.WaitGroup
	for range c.workers {
		warm.Add(1)
		go func() {
			defer warm.Done()
			_ = e.pool.QueryRow(ctx, "select 1").Scan(new(int))
			_ = e.app.Ping(ctx).Err()
			_ = e.base.Ping(ctx).Err()
		}()
	}
	warm.Wait()

	// The plain-hit baseline: a value of the same size that never expires, written again if anything deletes it.
	baseKey := e.prefix + "baseline"
	baseVal := strings.Repeat("x", 300)
	if err := e.base.Set(ctx, baseKey, baseVal, 0).Err(); err != nil {
		return nil, err
	}
	var baseMissing atomic.Int64

	var cnt stampedeCounters
	var measuring atomic.Bool
	setup, err := st.start(ctx, &strategyRun{stampedeEnv: e, name: name, prefix: e.prefix + name + ":",
		recompute: recompute, origin: o, cnt: &cnt, measuring: &measuring})
	if err != nil {
		return nil, err
	}
	defer setup.release()
	readers := setup.readers
	if len(readers) != c.workers {
		return nil, fmt.Errorf("set up %d readers for %d workers", len(readers), c.workers)
	}

	var lat, base []latencies
	lat = make([]latencies, c.workers)
	base = make([]latencies, c.workers)
	var stop atomic.Bool
	start := time.Now()
	winStart := start.Add(c.warmup)
	winEnd := winStart.Add(c.duration)
	var wg sync.WaitGroup
	pauseFor := func(r *rand.Rand) time.Duration {
		return 10*time.Millisecond + time.Duration(r.Int64N(int64(c.pause-10*time.Millisecond)+1))
	}
	sleep := func(d time.Duration) bool { return sleepCtx(ctx, d) && !stop.Load() } // a pause, d >= 10ms
	bg := context.WithoutCancel(ctx)
	for i := range c.workers {
		wg.Add(2)
		go func() { // a worker of the strategy
			defer wg.Done()
			r := rand.New(rand.NewPCG(c.seed, uint64(i)))
			for sleep(pauseFor(r)) {
				t0 := time.Now()
				out := readers[i](bg)
				d := time.Since(t0)
				if t0.Before(winStart) || !t0.Before(winEnd) {
					continue
				}
				cnt.samples.Add(1)
				switch {
				case out.err != nil:
					cnt.errs.Add(1)
					cnt.mu.Lock()
					if cnt.firstErr == nil {
						cnt.firstErr = out.err
					}
					cnt.mu.Unlock()
				case out.miss:
					cnt.misses.Add(1)
				default:
					cnt.hits.Add(1)
				}
				for _, f := range []struct {
					set bool
					n   *atomic.Int64
				}{{out.contention, &cnt.contention}, {out.early, &cnt.early}, {out.ducked, &cnt.ducked}, {out.stale, &cnt.stale}} {
					if f.set {
						f.n.Add(1)
					}
				}
				lat[i] = append(lat[i], d)
			}
		}()
		go func() { // a plain-hit baseline reader: GET of a key that never expires, same pacing
			defer wg.Done()
			r := rand.New(rand.NewPCG(c.seed+1, uint64(i)))
			for sleep(pauseFor(r)) {
				t0 := time.Now()
				err := e.base.Get(bg, baseKey).Err()
				d := time.Since(t0)
				if errors.Is(err, redis.Nil) {
					baseMissing.Add(1)
					_ = e.base.Set(bg, baseKey, baseVal, 0).Err()
				}
				if err == nil && !t0.Before(winStart) && t0.Before(winEnd) {
					base[i] = append(base[i], d)
				}
			}
		}()
	}
	// The measured window: the lockstep recorder counts asynchronous events (background refreshes) only inside it.
	pgssBefore := int64(-1)
	if !sleepCtx(ctx, time.Until(winStart)) {
		stop.Store(true)
		wg.Wait()
		return nil, ctx.Err()
	}
	measuring.Store(true)
	pgssBefore = e.pgssCalls(ctx)
	sleepCtx(ctx, time.Until(winEnd))
	measuring.Store(false)
	stop.Store(true)
	wg.Wait()
	pgssAfter := e.pgssCalls(bg)
	daemonRefreshes := setup.finish()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	res := &stampedeResult{Strategy: name, Samples: cnt.samples.Load(), Hits: cnt.hits.Load(), Misses: cnt.misses.Load(),
		Contentions: cnt.contention.Load(), Early: cnt.early.Load(), Ducked: cnt.ducked.Load(), Stale: cnt.stale.Load(),
		Errors: cnt.errs.Load(), Latency: latencies(slices.Concat(lat...)).summary(),
		Baseline: latencies(slices.Concat(base...)).summary(), Window: [2]time.Time{winStart, winEnd}}
	if cnt.firstErr != nil {
		res.FirstError = cnt.firstErr.Error()
	}
	if n := baseMissing.Load(); n > 0 {
		fmt.Fprintf(e.stderr, "stampede: %s: the baseline key was deleted by someone else %d times; written again each time\n", name, n)
	}
	o.mu.Lock()
	for _, ev := range o.events {
		if ev.at.Before(winStart) || !ev.at.Before(winEnd) {
			continue
		}
		res.Recomputes++
		if ev.daemon {
			res.DaemonRecomputes++
		}
		if ev.simul {
			res.Simultaneous++
		}
		res.Events = append(res.Events, recomputeEvent{At: ev.at.Sub(winStart), Took: ev.took.Sub(ev.at), Daemon: ev.daemon, Simul: ev.simul})
	}
	o.mu.Unlock()
	slices.SortFunc(res.Events, func(a, b recomputeEvent) int { return int(a.At - b.At) })
	if pgssBefore >= 0 && pgssAfter >= 0 {
		res.OriginPGSS = pgssAfter - pgssBefore
	} else {
		res.OriginPGSS = -1
	}
	if err := e.originSide(bg, name, res); err != nil {
		return nil, err
	}
	res.Daemon = daemonRefreshes
	return res, nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// originSide reads the recompute log that PostgreSQL itself wrote during the window: queries by source, and
// how many started while an earlier one was still in its pg_sleep.
func (e *stampedeEnv) originSide(ctx context.Context, strategy string, res *stampedeResult) error {
	rows, err := e.pool.Query(ctx, "select source, started from "+ident(e.schema)+
		".stampede_log where run = $1 and strategy = $2 and started >= $3 and started < $4 order by started",
		e.run, strategy, res.Window[0], res.Window[1])
	if err != nil {
		return fmt.Errorf("read the recompute log: %w", err)
	}
	defer rows.Close()
	var busyUntil time.Time
	for rows.Next() {
		var src string
		var at time.Time
		if err := rows.Scan(&src, &at); err != nil {
			return err
		}
		if src == "daemon" {
			res.OriginDaemon++
		} else {
			res.OriginApp++
		}
		if at.Before(busyUntil) {
			res.OriginOverlap++
		}
		if end := at.Add(e.c.recompute); end.After(busyUntil) {
			busyUntil = end
		}
	}
	return rows.Err()
}

// deletePrefix deletes the benchmark's keys: every key containing p (see redisserver.DeleteContaining), within
// 30 s. A failure is reported on stderr and does not fail the benchmark.
func deletePrefix(c redis.UniversalClient, p string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := redisserver.DeleteContaining(ctx, c, p); err != nil {
		fmt.Fprintf(os.Stderr, "keepwarm-bench: clean up keys: %v\n", err)
	}
}

func printStampede(w io.Writer, rep *stampedeReport) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "strategy\tsamples\thits\tmisses\trecomputes\t(daemon)\tsimultaneous\tlock contentions\tearly\tducked\tstale\terrors\tpg log (app+daemon)\tpg overlapping\tpg_stat_statements\tp50\tp99\tp99.9\tmax\tplain-hit p99\tp99 ratio\t")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d+%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%.2f\t\n",
			r.Strategy, r.Samples, r.Hits, r.Misses, r.Recomputes, r.DaemonRecomputes, r.Simultaneous, r.Contentions,
			r.Early, r.Ducked, r.Stale, r.Errors, r.OriginApp, r.OriginDaemon, r.OriginOverlap, r.OriginPGSS,
			benchload.Dur(r.Latency.P50), benchload.Dur(r.Latency.P99), benchload.Dur(r.Latency.P999), benchload.Dur(r.Latency.Max), benchload.Dur(r.Baseline.P99),
			ratio(r.Latency.P99, r.Baseline.P99))
	}
	_ = tw.Flush()
	for _, r := range rep.Results {
		if r.FirstError != "" {
			fmt.Fprintf(w, "%s: first error: %s\n", r.Strategy, r.FirstError)
		}
		if r.Daemon != nil {
			fmt.Fprintf(w, "%s: the warmer's refreshes by result: %v\n", r.Strategy, r.Daemon)
		}
	}
	want := float64(rep.Duration) / float64(rep.Expiry)
	for _, r := range rep.Results {
		if r.Strategy != "keepwarm" {
			continue
		}
		fmt.Fprintf(w, "\nkeepwarm targets: misses %d (want 0) %s; simultaneous recomputes %d (want 0) %s; client lock contentions %d (want 0) %s; recomputes %d (want duration/expiry = %.1f ±1) %s; p99 %s vs plain-hit p99 %s: ratio %.2f (want 1)\n",
			r.Misses, mark(r.Misses == 0), r.Simultaneous, mark(r.Simultaneous == 0), r.Contentions, mark(r.Contentions == 0),
			r.Recomputes, want, mark(float64(r.Recomputes) >= want-1 && float64(r.Recomputes) <= want+1),
			benchload.Dur(r.Latency.P99), benchload.Dur(r.Baseline.P99), ratio(r.Latency.P99, r.Baseline.P99))
	}
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func mark(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}
