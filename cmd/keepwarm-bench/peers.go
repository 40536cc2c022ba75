package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime"
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
	"github.com/keepwarm/keepwarm/warmer"
)

// The peers scenario puts keepwarm beside the libraries a Go team would pick instead, in one run, on
// the same Redis, PostgreSQL and workload, with a fleet of app instances: for each strategy (peerStrategies) and
// each fleet size N, N instances, each with its own Redis client and PostgreSQL pool as separate processes would
// have, read Zipf-distributed ids at a fixed planned rate; their origin is a real PostgreSQL query. Each cell
// (strategy × N) starts from an empty cache and is measured after a warm-up.
//
// Definitions, printed with every run:
//   - A hot key is one of the --hot ids with the highest Zipf probability (ids 1..hot: the sampler's rank k is
//     id k). The keepwarm daemon's top_n is not derived from it: the shipped default (warmer.DefaultTopN), or
//     --top-n for the tuned rows; the row keepwarm-defaults also keeps the shipped refresh_ahead.
//   - Origin queries per hot key per TTL = origin fetches of hot ids in the window ÷ (hot × window ÷ TTL). A
//     fetch of an id is one origin query whose id list held it (the daemon fetches a batch per query, an app one
//     id); the counting wrapper around every strategy's Source counts them, and pg_stat_statements counts the
//     queries from outside.
//   - A miss is a read that waited for an origin query: the value it returned was produced by a query that ended
//     after the read began (every value carries PostgreSQL's clock_timestamp() of the query that produced it,
//     taken after its pg_sleep), whatever path the read took (readWaited). That covers the read's own query, a
//     coalesced wait (singleflight), a wait on another process's lock, and a read whose first Redis GET found a
//     value that the library then rebuilt synchronously (sturdyc's distributed-storage path when the record is
//     older than refreshAfter), for every library alike, without trusting any library's own counters. The rule
//     also counts a hit that raced a refresh (the daemon's new value landed between the read's start and its
//     GET, tens of microseconds): a few false misses rather than hidden waits. A hook on each instance's client
//     (firstGetHook) sees the read's first GET; the misses whose first GET found a value are reported apart, as
//     the waits the earlier rule (which did not count them) hid. Reads answered from process memory send no GET.
//   - Latency is each whole read as the worker saw it, against plain GETs of never-expiring keys of the same
//     size, issued in the same window by other goroutines on their own client.

type peersConfig struct {
	services
	sharedRedis  bool
	redisPort    int
	instances    []int
	strategies   []peerStrategy
	duration     time.Duration
	warmup       time.Duration
	ttl          time.Duration
	jitter       float64
	skew         float64
	rate         float64
	workers      int
	keys         int
	hot          int
	cost         time.Duration
	lockTTL      time.Duration
	refreshAhead time.Duration
	topN         int // 0: the shipped default
	batchSize    int // the tuned rows' batch_size
	pgConns      int
	quick        bool
	svg          string
	jsonPath     string
	seed         uint64
	rounds       int
	orderSeed    uint64 // 0 until parsePeers picks one from the clock
}

func peersFlagSet(c *peersConfig, stderr io.Writer) (*flag.FlagSet, *string, *string) {
	fs := flag.NewFlagSet("peers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.services.flags(fs)
	fs.BoolVar(&c.sharedRedis, "shared-redis", false, "run against --redis instead of a private redis-server (INFO commandstats then counts every other client's commands too)")
	fs.IntVar(&c.redisPort, "redis-port", 0, "port of the private redis-server (0: a free one)")
	instances := fs.String("instances", "1,4,16", "comma-separated fleet sizes N: app instances, each with its own Redis client and PostgreSQL pool")
	strategies := fs.String("strategies", "all", "comma-separated strategies (each round runs them in a shuffled order): "+peerNames()+", or all")
	fs.DurationVar(&c.duration, "duration", 2*time.Minute, "measured window per cell (strategy × N)")
	fs.DurationVar(&c.warmup, "warmup", 20*time.Second, "reads before the window, not counted; each cell starts from an empty cache")
	fs.DurationVar(&c.ttl, "ttl", 10*time.Second, "cache TTL of every strategy (each maps it onto its own knobs; see the printed configurations)")
	fs.Float64Var(&c.jitter, "jitter", 0.1, "TTL jitter: Redis TTLs are written in [ttl, ttl×(1+jitter))")
	fs.Float64Var(&c.skew, "skew", 1.1, "Zipf exponent s (> 1) of the read load")
	fs.Float64Var(&c.rate, "rate", 3000, "planned reads per second, all instances together (the achieved rate is reported)")
	fs.IntVar(&c.workers, "workers", 64, "reading goroutines, all instances together (worker w reads through instance w mod N)")
	fs.IntVar(&c.keys, "keys", 10000, "ids in the synthetic table (the Zipf keyspace)")
	fs.IntVar(&c.hot, "hot", 100, "hot keys: the ids with the highest Zipf probability, for the hot-key figures (the daemon is not told)")
	fs.DurationVar(&c.cost, "cost", 5*time.Millisecond, "database work per id: an origin query for n ids spends n × cost in pg_sleep (0: none), standing for a real query's work")
	fs.DurationVar(&c.lockTTL, "lock-ttl", 5*time.Second, "lock TTL of every locking strategy (lockstep, redislock, redsync)")
	fs.DurationVar(&c.refreshAhead, "refresh-ahead", 500*time.Millisecond, "the tuned daemon rows' refresh_ahead (keepwarm-defaults keeps the shipped one; the lead is never less than 3× the rebuild p95, nor than statement_timeout max(300ms, 2 × batch_size ids × --cost) + pool wait 100ms)")
	fs.IntVar(&c.topN, "top-n", 0, "the tuned daemon rows' top_n (0: the shipped default, as keepwarm-defaults)")
	fs.IntVar(&c.batchSize, "batch-size", 40, "the tuned daemon rows' batch_size (keepwarm-defaults keeps the shipped 100): with --cost per id, a smaller batch has a shorter statement_timeout (2 × its sleep), which is the floor of the lead")
	fs.IntVar(&c.pgConns, "pg-conns", 4, "PostgreSQL connections per instance pool, and in the daemon's own pool (rows with the daemon have N × pg-conns + pg-conns)")
	fs.BoolVar(&c.quick, "quick", false, "the short variant, --duration 30s --warmup 10s: 81 cells (9 strategies × 3 N × 3 rounds) in about 55 minutes at the defaults (flags given explicitly win)")
	fs.StringVar(&c.svg, "svg", "", "write the plot (origin queries per hot key per TTL, hot p99 ratio, against N) to this SVG file")
	fs.StringVar(&c.jsonPath, "json", "", "write the results as JSON to this file")
	fs.Uint64Var(&c.seed, "seed", 1, "random seed of the readers' ids and pacing")
	fs.IntVar(&c.rounds, "rounds", 3, "rounds: every cell runs once per round, the strategies in a new order each round; the summary gives each figure's median and min–max")
	fs.Uint64Var(&c.orderSeed, "order-seed", 0, "random seed of the strategies' order in each round (0: one from the clock; the run prints it)")
	return fs, instances, strategies
}

func peerNames() string {
	var s []string
	for _, st := range peerStrategies {
		s = append(s, st.name)
	}
	return strings.Join(s, ",")
}

// parsePeers parses the peers subcommand's flags; every mistake is a usageError.
func parsePeers(args []string, stderr io.Writer) (peersConfig, error) {
	var c peersConfig
	fs, instances, strategies := peersFlagSet(&c, stderr)
	if err := parse(fs, args); err != nil {
		return c, err
	}
	if c.quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for name, v := range map[string]time.Duration{"duration": 30 * time.Second, "warmup": 10 * time.Second} {
			if !set[name] {
				_ = fs.Set(name, v.String())
			}
		}
	}
	var problems []string
	check := func(ok bool, msg string) {
		if !ok {
			problems = append(problems, msg)
		}
	}
	check(c.duration > 0, "--duration must be > 0")
	check(c.warmup >= 0, "--warmup must be >= 0")
	check(c.ttl >= time.Second, "--ttl must be >= 1s (go-redis/cache turns a shorter TTL into 1h)")
	check(c.jitter >= 0 && c.jitter <= 1, "--jitter must be in [0, 1]")
	check(c.skew > 1 && !math.IsInf(c.skew, 0), "--skew must be > 1 (math/rand/v2's Zipf)")
	check(c.rate > 0 && !math.IsInf(c.rate, 0), "--rate must be > 0")
	check(c.workers >= 1, "--workers must be >= 1")
	check(c.keys >= 2, "--keys must be >= 2")
	check(c.hot >= 1 && c.hot <= c.keys, "--hot must be in [1, --keys]")
	check(c.cost >= 0, "--cost must be >= 0")
	check(c.lockTTL > c.cost, "--lock-ttl must exceed --cost")
	check(c.refreshAhead > 0 && c.refreshAhead < c.ttl/2, "--refresh-ahead must be in (0, ttl/2)")
	check(c.pgConns >= 1, "--pg-conns must be >= 1")
	check(c.topN >= 0 && c.topN <= warmer.MaxTopN, fmt.Sprintf("--top-n must be in [0, %d]", warmer.MaxTopN))
	check(c.rounds >= 1, "--rounds must be >= 1")
	check(c.batchSize >= 1 && c.batchSize <= warmer.DefaultBatchSize, fmt.Sprintf("--batch-size must be in [1, %d]", warmer.DefaultBatchSize))
	check(c.cost < 0 || daemonStatementTimeout(c.cost, warmer.DefaultBatchSize)+daemonPoolWait <= c.ttl/2,
		"--cost too long for --ttl: the daemon's statement timeout (2 × a full batch's sleep) must fit in half the TTL")
	check(c.redisPort >= 0 && c.redisPort < 65536, "--redis-port must be a port number")
	var err error
	if c.instances, err = parseInstances(*instances); err != nil {
		problems = append(problems, err.Error())
	}
	for _, n := range c.instances {
		check(n <= c.workers, fmt.Sprintf("--instances %d: more instances than --workers %d (an instance needs a reader)", n, c.workers))
	}
	if *strategies == "all" {
		*strategies = peerNames()
	}
	seen := map[string]bool{}
	for _, s := range strings.Split(*strategies, ",") {
		s = strings.TrimSpace(s)
		st, ok := peerByName(s)
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("--strategies: unknown strategy %q (known: %s)", s, peerNames()))
		case seen[s]:
			problems = append(problems, fmt.Sprintf("--strategies: %q listed twice", s))
		default:
			seen[s] = true
			c.strategies = append(c.strategies, st)
		}
	}
	if len(problems) > 0 {
		return c, usageError{errors.New(strings.Join(problems, "; "))}
	}
	if c.orderSeed == 0 {
		c.orderSeed = uint64(time.Now().UnixNano())
	}
	return c, nil
}

// roundOrder returns the strategies in the order round runs them: a shuffle of sts seeded by (seed, round), so
// that no strategy always runs first or last and the same seed gives the same orders again.
func roundOrder(sts []peerStrategy, seed uint64, round int) []peerStrategy {
	out := slices.Clone(sts)
	r := rand.New(rand.NewPCG(seed, uint64(round)))
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// parseInstances parses "1,4,16": positive fleet sizes, each at most 256, none twice.
func parseInstances(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 256 {
			return nil, fmt.Errorf("--instances: %q is not a number in [1, 256]", strings.TrimSpace(f))
		}
		if slices.Contains(out, n) {
			return nil, fmt.Errorf("--instances: %d listed twice", n)
		}
		out = append(out, n)
	}
	return out, nil
}

func runPeers(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parsePeers(args, stderr)
	if err != nil {
		return err
	}
	rep, err := peers(ctx, c, stdout, stderr)
	if err != nil {
		return err
	}
	return writeResults(c.svg, c.jsonPath, rep, peersSVG, stderr)
}

// peersReport is one run: every cell, measured in the same invocation.
type peersReport struct {
	Machine      machine        `json:"machine"`
	Started      time.Time      `json:"started"`
	Redis        string         `json:"redis"` // "private redis-server" or the shared URL's host
	TTL          time.Duration  `json:"ttl_ns"`
	Jitter       float64        `json:"jitter"`
	Skew         float64        `json:"skew"`
	Keys         int            `json:"keys"`
	Hot          int            `json:"hot"`
	HotShare     float64        `json:"hot_share"` // the Zipf probability mass of the hot ids, in [0, 1]
	Rate         float64        `json:"planned_reads_per_s"`
	Workers      int            `json:"workers"`
	Cost         time.Duration  `json:"origin_cost_ns"`
	Duration     time.Duration  `json:"duration_ns"`
	Warmup       time.Duration  `json:"warmup_ns"`
	Configs      []peerConfig   `json:"configs"`
	Rounds       int            `json:"rounds"`
	OrderSeed    uint64         `json:"order_seed"`
	Orders       [][]string     `json:"orders"` // the strategies' order in each round
	Results      []peersResult  `json:"results"`
	Summary      []peersSummary `json:"summary"`
	HotDefinedAs string         `json:"hot_defined_as"`
}

// peerConfig is how one strategy was configured, as printed.
type peerConfig struct {
	Strategy string `json:"strategy"`
	Library  string `json:"library"`
	Config   string `json:"config"`
	// PGConns is the strategy's PostgreSQL connection budget per cell, as a formula in N.
	PGConns string `json:"postgres_connections"`
}

// peersResult is one cell: a strategy with N instances. Counts are over the measured window unless named "cell".
type peersResult struct {
	Strategy  string  `json:"strategy"`
	Instances int     `json:"instances"`
	Round     int     `json:"round"` // 1-based
	Reads     int64   `json:"reads"`
	ReadsPerS float64 `json:"reads_per_s"`
	Errors    int64   `json:"errors"`
	// FirstError is the first read error's text, if any.
	FirstError string `json:"first_error,omitempty"`
	Misses     int64  `json:"misses"`
	// FoundMisses are the misses whose first Redis GET found a value (the library then waited for the origin
	// anyway); the miss rule before issue 35 did not count them.
	FoundMisses int64 `json:"misses_first_get_found"`
	HotReads    int64 `json:"hot_reads"`
	HotMisses   int64 `json:"hot_misses"`
	// HotMissSamples are up to 20 of the hot misses (the first few per worker).
	HotMissSamples []hotMiss `json:"hot_miss_samples,omitempty"`
	// Origin side, counted by the wrapper around every Source: queries and id fetches in the window (app and
	// daemon together), the daemon's share, and per hot id.
	OriginQueries      int64            `json:"origin_queries"`
	OriginFetches      int64            `json:"origin_fetches"`
	OriginHotFetches   int64            `json:"origin_hot_fetches"`
	DaemonQueries      int64            `json:"daemon_queries"`
	DaemonFetches      int64            `json:"daemon_fetches"`
	OriginTime         time.Duration    `json:"origin_time_ns"` // time spent in the window's origin queries, summed over queries
	DaemonOriginTime   time.Duration    `json:"daemon_origin_time_ns"`
	OriginErrors       int64            `json:"origin_errors"`
	SimultaneousHot    int64            `json:"simultaneous_hot_fetches"` // hot-id fetches that started while another fetch of that id was in flight
	PerHotKeyPerTTL    float64          `json:"origin_per_hot_key_per_ttl"`
	MaxPerHotKeyPerTTL float64          `json:"origin_per_hot_key_per_ttl_max"` // the worst hot id's
	HotIDsRated        int              `json:"hot_ids_rated"`                  // hot ids with ≥ 2 fetches in the window, which the two above average
	CellQueries        int64            `json:"cell_origin_queries"`            // from before the first instance started to after the last stopped
	CellPGSS           int64            `json:"cell_pg_stat_statements"`        // -1: extension not available
	Latency            latencySummary   `json:"latency"`
	HotLatency         latencySummary   `json:"hot_latency"`
	Baseline           latencySummary   `json:"plain_hit_latency"`
	Age                latencySummary   `json:"value_age"` // now − the origin query's clock_timestamp(), at each read's end
	RedisCommands      int64            `json:"redis_commands"`
	BaselineGets       int64            `json:"baseline_gets"`
	CommandsPerRead    float64          `json:"redis_commands_per_read"`
	Commands           map[string]int64 `json:"commands,omitempty"`
	HeapPerInstance    float64          `json:"heap_bytes_per_instance"`
	Daemon             map[string]int64 `json:"daemon_refreshes,omitempty"`
	NearHits           int64            `json:"near_hits,omitempty"`     // reads served from process memory in the window (near rows)
	HotNoGet           int64            `json:"hot_reads_without_get"`   // hot reads that sent no GET: from process memory (every row)
	HotNoGetLatency    latencySummary   `json:"hot_latency_without_get"` // their latency
	NearBypasses       int64            `json:"near_bypasses,omitempty"` // reads that found the near cache down
	Window             [2]time.Time     `json:"window"`
}

type peersEnv struct {
	c       peersConfig
	run     string
	prefix  string
	url     string        // the Redis every instance uses
	private bool          // url is a private redis-server
	ctl     *redis.Client // the harness's own client: commandstats, baseline keys, clean-up
	base    *redis.Client // the plain-hit baseline readers' client
	pool    *pgxpool.Pool // the harness's pool: set-up and pg_stat_statements
	log     *slog.Logger
	stderr  io.Writer
	ids     []string // ids[k] is the id of Zipf rank k, "1".."keys"
}

func peers(ctx context.Context, c peersConfig, stdout, stderr io.Writer) (*peersReport, error) {
	e := &peersEnv{c: c, stderr: stderr, log: slog.New(slog.DiscardHandler)}
	e.run = strconv.FormatInt(time.Now().UnixNano(), 36)
	e.prefix = "kwbench-peers:" + e.run + ":"
	e.url = c.redisURL
	redisDesc := "shared " + c.redisURL
	if !c.sharedRedis {
		srv, err := redisserver.StartPort(ctx, c.redisPort)
		if err != nil {
			return nil, err
		}
		defer srv.Stop()
		e.url, e.private = srv.URL, true
		redisDesc = "private redis-server " + srv.URL
	}
	var err error
	if e.ctl, err = benchload.NewRedis(ctx, e.url, 4); err != nil {
		return nil, err
	}
	defer e.ctl.Close()
	if e.base, err = benchload.NewRedis(ctx, e.url, 16); err != nil {
		return nil, err
	}
	defer e.base.Close()
	if e.pool, err = benchload.NewPool(ctx, c.postgresURL, 2); err != nil {
		return nil, err
	}
	defer e.pool.Close()
	if err := e.setupDB(ctx); err != nil {
		return nil, err
	}
	e.ids = make([]string, c.keys)
	for i := range e.ids {
		e.ids[i] = strconv.Itoa(i + 1)
	}
	rep := &peersReport{Machine: describeMachine(ctx, e.ctl, e.pool), Started: time.Now(), Redis: redisDesc,
		TTL: c.ttl, Jitter: c.jitter, Skew: c.skew, Keys: c.keys, Hot: c.hot, HotShare: zipfShare(c.skew, c.keys, c.hot),
		Rate: c.rate, Workers: c.workers, Cost: c.cost, Duration: c.duration, Warmup: c.warmup, Rounds: c.rounds, OrderSeed: c.orderSeed}
	rep.HotDefinedAs = fmt.Sprintf("the %d ids of highest Zipf(s=%g) probability over %d ids (ids 1..%d), %.1f%% of reads",
		c.hot, c.skew, c.keys, c.hot, 100*rep.HotShare)
	for _, st := range c.strategies {
		conns := fmt.Sprintf("N × %d", c.pgConns)
		if st.hasDaemon() {
			conns += fmt.Sprintf(" + %d (the daemon's)", c.pgConns)
		}
		rep.Configs = append(rep.Configs, peerConfig{Strategy: st.name, Library: st.library, Config: st.config(c), PGConns: conns})
	}
	fmt.Fprintln(stdout, rep.Machine)
	fmt.Fprintf(stdout, "peers: %s; PostgreSQL table %s.peers_value, %d ids, origin query by primary key + pg_sleep(%v × ids in the query)\n",
		redisDesc, c.schema, c.keys, c.cost)
	fmt.Fprintf(stdout, "load: Zipf s=%g, %.0f reads/s planned over %d workers (worker w reads through instance w mod N), TTL %v, jitter %g; %v warm-up + %v measured per cell, each cell from an empty cache\n",
		c.skew, c.rate, c.workers, c.ttl, c.jitter, c.warmup, c.duration)
	fmt.Fprintf(stdout, "hot keys: %s\n", rep.HotDefinedAs)
	fmt.Fprintf(stdout, "PostgreSQL connections: each app instance has its own pool of %d (--pg-conns), N × %d per cell; the rows with the daemon "+
		"also give it a pool of its own of %d, N × %d + %d: not equalised, disclosed here and per row\n", c.pgConns, c.pgConns, c.pgConns, c.pgConns, c.pgConns)
	fmt.Fprintln(stdout, "configurations:")
	for _, pc := range rep.Configs {
		fmt.Fprintf(stdout, "  %-22s %s; PostgreSQL connections %s: %s\n", pc.Strategy, pc.Library, pc.PGConns, pc.Config)
	}
	orders := make([][]peerStrategy, c.rounds)
	for i := range orders {
		orders[i] = roundOrder(c.strategies, c.orderSeed, i+1)
		var names []string
		for _, st := range orders[i] {
			names = append(names, st.name)
		}
		rep.Orders = append(rep.Orders, names)
	}
	fmt.Fprintf(stdout, "rounds: %d, each cell once per round; order seed %d (--order-seed %d repeats these orders):\n", c.rounds, c.orderSeed, c.orderSeed)
	for i, names := range rep.Orders {
		fmt.Fprintf(stdout, "  round %d: %s\n", i+1, strings.Join(names, ", "))
	}
	for round, order := range orders {
		for _, n := range c.instances {
			for _, st := range order {
				fmt.Fprintf(stderr, "peers: round %d/%d: %s with %d instances for %v (+%v warm-up)\n", round+1, c.rounds, st.name, n, c.duration, c.warmup)
				res, err := e.runCell(ctx, st, n)
				if err != nil {
					return nil, fmt.Errorf("round %d, %s, %d instances: %w", round+1, st.name, n, err)
				}
				res.Round = round + 1
				rep.Results = append(rep.Results, *res)
			}
		}
	}
	rep.Summary = summarizePeers(rep)
	printPeers(stdout, rep)
	return rep, nil
}

// zipfShare returns the probability mass of ranks 1..hot under P(k) ∝ k^-s over 1..keys (math/rand/v2's Zipf
// with v = 1).
func zipfShare(s float64, keys, hot int) float64 {
	var all, head float64
	for k := 1; k <= keys; k++ {
		p := math.Pow(float64(k), -s)
		all += p
		if k <= hot {
			head += p
		}
	}
	return head / all
}

// peerView returns the name of the view a strategy's queries read (one per strategy and side, so that
// pg_stat_statements counts them apart).
func peerView(strategy string, daemon bool) string {
	v := "peers_v_" + strings.NewReplacer("-", "_", "+", "_").Replace(strategy)
	if daemon {
		v += "_daemon"
	}
	return v
}

// setupDB creates the value table (keys rows of about 300 bytes) and one view per strategy and side, under an
// advisory lock so parallel runs do not race.
func (e *peersEnv) setupDB(ctx context.Context) error {
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	s := ident(e.c.schema)
	qs := []string{
		"select pg_advisory_xact_lock(7734024)",
		"create schema if not exists " + s,
		"create table if not exists " + s + ".peers_value (id text primary key, value text not null)",
		fmt.Sprintf(`insert into %s.peers_value select g::text, '{"id": ' || g || ', "name": "track ' || g || '", "payload": "' || repeat('x', 240) || '"}'
from generate_series(1, %d) g on conflict (id) do nothing`, s, e.c.keys),
	}
	for _, st := range peerStrategies {
		for _, daemon := range []bool{false, true} {
			qs = append(qs, "create or replace view "+s+"."+peerView(st.name, daemon)+" as select id, value from "+s+".peers_value")
		}
	}
	for _, q := range qs {
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("set up %s: %w", q, err)
		}
	}
	return tx.Commit(ctx)
}

// originQuery is a strategy's origin query: it returns each requested id's row, prefixed with PostgreSQL's
// clock_timestamp() in microseconds and a space, after pg_sleep(cost × the number of ids asked for): database
// work is modelled per id, so a daemon batch of 100 ids costs what 100 app misses cost. The view name sets it
// apart in pg_stat_statements.
func (e *peersEnv) originQuery(strategy string, daemon bool) string {
	sleep := ""
	if e.c.cost > 0 {
		sleep = fmt.Sprintf(", (select pg_sleep(%g * cardinality($1::text[]))) d", e.c.cost.Seconds())
	}
	return fmt.Sprintf(`select v.id, (extract(epoch from clock_timestamp()) * 1000000)::bigint::text || ' ' || v.value from %s.%s v%s where v.id = any($1::text[])`,
		ident(e.c.schema), peerView(strategy, daemon), sleep)
}

// pgssCalls returns the calls pg_stat_statements counted for a strategy's queries (app and daemon), or -1
// without the extension.
func (e *peersEnv) pgssCalls(ctx context.Context, strategy string) int64 {
	var n int64
	err := e.pool.QueryRow(ctx, `select coalesce(sum(s.calls), 0)::bigint from pg_stat_statements s
join pg_database d on d.oid = s.dbid where d.datname = current_database() and (strpos(s.query, $1) > 0 or strpos(s.query, $2) > 0)`,
		ident(e.c.schema)+"."+peerView(strategy, false)+" v", ident(e.c.schema)+"."+peerView(strategy, true)+" v").Scan(&n)
	if err != nil {
		return -1
	}
	return n
}

// fetchedAt reads the origin timestamp a value starts with (see originQuery): microseconds since the epoch.
func fetchedAt(v []byte) (int64, bool) {
	i := slices.Index(v, ' ')
	if i <= 0 {
		return 0, false
	}
	us, err := strconv.ParseInt(string(v[:i]), 10, 64)
	return us, err == nil
}

// originCounter is the counting wrapper around every origin query of one cell. Window counts take the query's
// start time; cell counts everything.
type originCounter struct {
	hot              int
	winStart, winEnd atomic.Int64 // the measured window, Unix ns; both 0 (no window) until the harness sets them
	cellQueries      atomic.Int64 // queries that returned without error, the whole cell
	inflight         atomic.Int64
	queries, fetches atomic.Int64
	hotFetches       atomic.Int64
	dQueries         atomic.Int64
	dFetches         atomic.Int64
	errs             atomic.Int64
	simulHot         atomic.Int64
	nanos, dNanos    atomic.Int64   // time spent in window queries (origin time), all and the daemon's, ns
	hotInflight      []atomic.Int64 // fetches of hot id i+1 in flight now
	mu               sync.Mutex     // guards perHot
	perHot           []hotFetches   // window fetches of hot id i+1
}

// hotFetches are one hot id's origin fetches that started in the window: how many, the first and the last start.
type hotFetches struct {
	n           int
	first, last time.Time
}

// perTTL is the id's fetch rate per ttl, (n − 1) ÷ (last − first) × ttl, and false with fewer than 2 fetches.
// Measured between fetches rather than over the window, it does not depend on where the window falls against the
// id's refresh cycle: with a 30s window and a 10s TTL, a count over the window is 3 or 4 for the same cycle,
// ±1/3.
func (h hotFetches) perTTL(ttl time.Duration) (float64, bool) {
	span := h.last.Sub(h.first)
	if h.n < 2 || span <= 0 {
		return 0, false
	}
	return float64(h.n-1) * ttl.Seconds() / span.Seconds(), true
}

func newOriginCounter(hot int) *originCounter {
	return &originCounter{hot: hot, perHot: make([]hotFetches, hot), hotInflight: make([]atomic.Int64, hot)}
}

// setWindow sets the measured window; queries that start inside [from, to) count in it.
func (o *originCounter) setWindow(from, to time.Time) {
	o.winEnd.Store(to.UnixNano())
	o.winStart.Store(from.UnixNano())
}

// hotIndex returns id's index among the hot ids, or -1.
func (o *originCounter) hotIndex(id string) int {
	n, err := strconv.Atoi(id)
	if err != nil || n < 1 || n > o.hot {
		return -1
	}
	return n - 1
}

// countedSource is a strategy's PostgreSQL source behind the counting wrapper; it is the warmer's Source and, via
// benchload.LoaderOf, the apps' loader.
type countedSource struct {
	o      *originCounter
	src    *postgres.Source
	daemon bool
}

// ValidID is the PostgreSQL source's id check (warmer.IDValidator).
func (s countedSource) ValidID(id string) error { return s.src.ValidID(id) }

// Fetch runs the origin query for ids and counts it.
func (s countedSource) Fetch(ctx context.Context, ids []string) (map[string][]byte, []string, error) {
	o := s.o
	start := time.Now()
	now := start.UnixNano()
	inWin := now >= o.winStart.Load() && now < o.winEnd.Load()
	o.inflight.Add(1)
	var hot []int
	for _, id := range ids {
		if i := o.hotIndex(id); i >= 0 {
			hot = append(hot, i)
			if o.hotInflight[i].Add(1) > 1 && inWin {
				o.simulHot.Add(1)
			}
		}
	}
	t0 := time.Now()
	vals, missing, err := s.src.Fetch(ctx, ids)
	took := int64(time.Since(t0))
	for _, i := range hot {
		o.hotInflight[i].Add(-1)
	}
	if err == nil {
		o.cellQueries.Add(1)
	}
	if inWin {
		if err != nil {
			o.errs.Add(1)
		}
		o.queries.Add(1)
		o.nanos.Add(took)
		o.fetches.Add(int64(len(ids)))
		o.hotFetches.Add(int64(len(hot)))
		o.mu.Lock()
		for _, i := range hot {
			h := &o.perHot[i]
			if h.n == 0 || start.Before(h.first) {
				h.first = start
			}
			if start.After(h.last) {
				h.last = start
			}
			h.n++
		}
		o.mu.Unlock()
		if s.daemon {
			o.dQueries.Add(1)
			o.dFetches.Add(int64(len(ids)))
			o.dNanos.Add(took)
		}
	}
	o.inflight.Add(-1)
	return vals, missing, err
}

// source returns strategy's counted PostgreSQL source on pool, as an app instance's (statement timeout: half the
// lock TTL). The daemon's is built from its config file (peerRun.daemon).
func (e *peersEnv) source(pool *pgxpool.Pool, o *originCounter, strategy string, daemon bool) (countedSource, error) {
	cfg := postgres.Config{Keyspace: "peers", Query: e.originQuery(strategy, daemon), StatementTimeout: e.c.lockTTL / 2}
	src, err := postgres.New(pool, cfg)
	if err != nil {
		return countedSource{}, err
	}
	return countedSource{o: o, src: src, daemon: daemon}, nil
}

// daemonPoolWait is the daemon's [postgres] pool_wait_timeout in this scenario: the warmer's lead is never less
// than it plus statement_timeout (daemonStatementTimeout), so both are kept short to let refresh_ahead set the lead.
const daemonPoolWait = 100 * time.Millisecond

// daemonStatementTimeout is the daemon's [postgres] statement_timeout for cost per id and batches of batch ids:
// 300ms, or twice what a full batch sleeps when that is longer, so that a batch is never cut short.
func daemonStatementTimeout(cost time.Duration, batch int) time.Duration {
	return max(300*time.Millisecond, 2*time.Duration(batch)*cost)
}

// jitterTTL returns a TTL drawn from [ttl, ttl×(1+jitter)) with lockstep.Jitter, the formula lockstep and the
// warmer write TTLs with.
func jitterTTL(ttl time.Duration, jitter float64) time.Duration {
	return lockstep.Jitter(ttl, jitter, rand.Float64())
}

// peerWorker is one reading goroutine's tallies; only its goroutine writes them until the cell's readers stop.
type peerWorker struct {
	reads, errs, misses, hotReads, hotMisses int64
	foundMisses                              int64 // misses whose first GET found a value
	hotNoGet                                 int64 // hot reads that sent no GET (served from process memory)
	firstErr                                 error
	lat, hotLat, age                         latencies
	hotNoGetLat                              latencies // the latencies of those
	hotMissAt                                []hotMiss // the first few
}

// hotMiss is one miss of a hot id: when in the window it began, and how long it took.
type hotMiss struct {
	ID   string        `json:"id"`
	At   time.Duration `json:"at_ns"`
	Took time.Duration `json:"took_ns"`
}

// readWaited applies the miss rule to one read that began at began and returned a value produced (the origin's
// clock_timestamp()) at producedUS, Unix microseconds: it waited for the origin when the value was produced after
// it began, whatever its first GET saw (first, a firstGet* state). found reports a miss whose first GET had found
// a value, one the rule before issue 35 did not count.
func readWaited(producedUS int64, began time.Time, first int32) (waited, found bool) {
	waited = producedUS > began.UnixMicro()
	return waited, waited && first == firstGetFound
}

// readState is one read's first Redis GET as firstGetHook saw it: firstGetNone until a GET of the read answered,
// then firstGetFound or firstGetMissing. Atomic: a library may go on sending commands with the read's context
// from another goroutine (lockstep's background XFetch refresh) after the read returned.
type readState struct{ first atomic.Int32 }

const (
	firstGetNone    = 0
	firstGetFound   = 1
	firstGetMissing = 2
)

type readStateKey struct{}

// withReadState returns ctx carrying a new readState.
func withReadState(ctx context.Context) (context.Context, *readState) {
	rs := &readState{}
	return context.WithValue(ctx, readStateKey{}, rs), rs
}

// firstGetHook records, in the readState of the command's context, whether the first GET a read sent found a
// value. It is added to every instance's client.
type firstGetHook struct{}

func (firstGetHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (firstGetHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		noteFirstGet(ctx, cmd, err)
		return err
	}
}

func (firstGetHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if name := cmd.Name(); name == "get" || name == "mget" {
				noteFirstGet(ctx, cmd, cmd.Err())
				break
			}
		}
		return err
	}
}

// noteFirstGet records cmd's outcome err in ctx's readState if cmd is a GET or an MGET (sturdyc's batch reads
// of its Redis storage) and the read's first: found when every key had a value. A single command's error is the
// one its hook returned: go-redis sets cmd.Err() only after the hooks have run.
func noteFirstGet(ctx context.Context, cmd redis.Cmder, err error) {
	rs, _ := ctx.Value(readStateKey{}).(*readState)
	if rs == nil || rs.first.Load() != firstGetNone || (cmd.Name() != "get" && cmd.Name() != "mget") {
		return
	}
	state := int32(firstGetMissing)
	if err == nil {
		state = firstGetFound
	}
	if m, ok := cmd.(*redis.SliceCmd); ok && err == nil && slices.Contains(m.Val(), nil) {
		state = firstGetMissing
	}
	rs.first.CompareAndSwap(firstGetNone, state)
}

// runCell runs one strategy with n instances: warm-up, measured window, clean-up.
func (e *peersEnv) runCell(ctx context.Context, st peerStrategy, n int) (*peersResult, error) {
	c := e.c
	prefix := e.prefix + st.name + ":" + strconv.Itoa(n) + ":"
	defer deletePrefix(e.ctl, prefix)

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heapBefore := ms.HeapAlloc
	pgssBefore := e.pgssCalls(ctx, st.name)

	o := newOriginCounter(c.hot)
	run := &peerRun{peersEnv: e, name: st.name, prefix: prefix, n: n, origin: o}
	setup, err := st.start(ctx, run)
	if err != nil {
		return nil, err
	}
	defer setup.release()
	if len(setup.instances) != n {
		return nil, fmt.Errorf("set up %d instances, want %d", len(setup.instances), n)
	}
	start := time.Now()
	winStart := start.Add(c.warmup)
	winEnd := winStart.Add(c.duration)
	o.setWindow(winStart, winEnd) // before any read starts; the daemon's queries until now count in the cell only

	// The plain-hit baseline: 100 never-expiring keys of a value's size.
	baseVal := strings.Repeat("x", 300)
	baseKeys := make([]string, 100)
	if _, err := e.base.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range baseKeys {
			baseKeys[i] = prefix + "baseline:" + strconv.Itoa(i)
			p.Set(ctx, baseKeys[i], baseVal, 0)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("write the baseline keys: %w", err)
	}

	bg := context.WithoutCancel(ctx)
	var stop atomic.Bool
	workers := make([]peerWorker, c.workers)
	var wg sync.WaitGroup
	interval := time.Duration(float64(c.workers) / c.rate * float64(time.Second))
	pace := func(r *rand.Rand, next *time.Time, iv time.Duration) bool {
		*next = next.Add(iv)
		now := time.Now()
		switch d := next.Sub(now); {
		case d > 0:
			if !sleepCtx(ctx, d) {
				return false
			}
		case d < -time.Second: // fell more than a second behind (a long stall): drop the backlog
			*next = now
		}
		return !stop.Load() && time.Now().Before(winEnd)
	}
	for w := range c.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wk := &workers[w]
			read := setup.instances[w%n].read
			r := rand.New(rand.NewPCG(c.seed, uint64(w)))
			z := rand.NewZipf(r, c.skew, 1, uint64(c.keys-1))
			next := start.Add(time.Duration(r.Int64N(int64(interval) + 1)))
			for pace(r, &next, interval) {
				k := int(z.Uint64())
				id := e.ids[k]
				rctx, rs := withReadState(bg)
				t0 := time.Now()
				v, err := read(rctx, id)
				t1 := time.Now()
				if t0.Before(winStart) {
					continue
				}
				hot := k < c.hot
				wk.reads++
				if hot {
					wk.hotReads++
				}
				if err != nil {
					wk.errs++
					if wk.firstErr == nil {
						wk.firstErr = err
					}
					continue
				}
				d := t1.Sub(t0)
				wk.lat = append(wk.lat, d)
				if hot {
					wk.hotLat = append(wk.hotLat, d)
				}
				us, ok := fetchedAt(v)
				if !ok {
					wk.errs++
					if wk.firstErr == nil {
						wk.firstErr = fmt.Errorf("id %s: value %.40q has no origin timestamp", id, v)
					}
					continue
				}
				wk.age = append(wk.age, t1.Sub(time.UnixMicro(us)))
				if hot && rs.first.Load() == firstGetNone {
					wk.hotNoGet++
					wk.hotNoGetLat = append(wk.hotNoGetLat, d)
				}
				if waited, found := readWaited(us, t0, rs.first.Load()); waited {
					wk.misses++
					if found {
						wk.foundMisses++
					}
					if hot {
						wk.hotMisses++
						if len(wk.hotMissAt) < 5 {
							wk.hotMissAt = append(wk.hotMissAt, hotMiss{ID: id, At: t0.Sub(winStart), Took: t1.Sub(t0)})
						}
					}
				}
			}
		}()
	}
	// Baseline readers: a quarter of the planned rate over 8 goroutines, on their own client.
	const baseWorkers = 8
	base := make([]latencies, baseWorkers)
	var baseGets atomic.Int64
	baseIv := time.Duration(float64(baseWorkers) / (c.rate / 4) * float64(time.Second))
	for b := range baseWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(c.seed+1, uint64(b)))
			next := start.Add(time.Duration(r.Int64N(int64(baseIv) + 1)))
			for pace(r, &next, baseIv) {
				key := baseKeys[r.IntN(len(baseKeys))]
				t0 := time.Now()
				err := e.base.Get(bg, key).Err()
				d := time.Since(t0)
				if errors.Is(err, redis.Nil) { // deleted by someone else: write it again
					_ = e.base.Set(bg, key, baseVal, 0).Err()
				}
				if !t0.Before(winStart) && t0.Before(winEnd) {
					baseGets.Add(1)
					if err == nil {
						base[b] = append(base[b], d)
					}
				}
			}
		}()
	}

	if !sleepCtx(ctx, time.Until(winStart)) {
		stop.Store(true)
		wg.Wait()
		return nil, ctx.Err()
	}
	stats0, err0 := commandUsec(bg, e.ctl)
	nearHits0, nearBypasses0 := setup.near.snapshot()
	sleepCtx(ctx, time.Until(winEnd))
	stats1, err1 := commandUsec(bg, e.ctl)
	nearHits1, nearBypasses1 := setup.near.snapshot()
	stop.Store(true)
	wg.Wait()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	runtime.GC()
	runtime.ReadMemStats(&ms)
	heapPer := (float64(ms.HeapAlloc) - float64(heapBefore)) / float64(n)
	daemon := setup.finish()
	setup.release()
	// Let every origin query end (sturdyc's background refreshes start in goroutines after their read returned),
	// then read the wrapper's count and PostgreSQL's together: again if a query ran in between.
	var cellQueries, pgssAfter int64
	for try := 0; try < 5; try++ {
		for deadline := time.Now().Add(10 * time.Second); o.inflight.Load() > 0 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond)
		cellQueries = o.cellQueries.Load()
		pgssAfter = e.pgssCalls(bg, st.name)
		if o.inflight.Load() == 0 && o.cellQueries.Load() == cellQueries {
			break
		}
	}

	res := &peersResult{Strategy: st.name, Instances: n, Window: [2]time.Time{winStart, winEnd}, Daemon: daemon,
		HeapPerInstance: heapPer, BaselineGets: baseGets.Load()}
	var lat, hotLat, age, hotNoGetLat []latencies
	for i := range workers {
		wk := &workers[i]
		res.Reads += wk.reads
		res.Errors += wk.errs
		res.Misses += wk.misses
		res.FoundMisses += wk.foundMisses
		res.HotReads += wk.hotReads
		res.HotMisses += wk.hotMisses
		res.HotNoGet += wk.hotNoGet
		hotNoGetLat = append(hotNoGetLat, wk.hotNoGetLat)
		if wk.firstErr != nil && res.FirstError == "" {
			res.FirstError = wk.firstErr.Error()
		}
		lat, hotLat, age = append(lat, wk.lat), append(hotLat, wk.hotLat), append(age, wk.age)
		for _, m := range wk.hotMissAt {
			if len(res.HotMissSamples) < 20 {
				res.HotMissSamples = append(res.HotMissSamples, m)
			}
		}
	}
	res.ReadsPerS = float64(res.Reads) / c.duration.Seconds()
	res.Latency = latencies(slices.Concat(lat...)).summary()
	res.HotLatency = latencies(slices.Concat(hotLat...)).summary()
	res.HotNoGetLatency = latencies(slices.Concat(hotNoGetLat...)).summary()
	res.Age = latencies(slices.Concat(age...)).summary()
	res.Baseline = latencies(slices.Concat(base...)).summary()
	res.OriginQueries, res.OriginFetches, res.OriginHotFetches = o.queries.Load(), o.fetches.Load(), o.hotFetches.Load()
	res.DaemonQueries, res.DaemonFetches, res.OriginErrors = o.dQueries.Load(), o.dFetches.Load(), o.errs.Load()
	if setup.near != nil {
		res.NearHits, res.NearBypasses = nearHits1-nearHits0, nearBypasses1-nearBypasses0
	}
	res.SimultaneousHot = o.simulHot.Load()
	res.OriginTime, res.DaemonOriginTime = time.Duration(o.nanos.Load()), time.Duration(o.dNanos.Load())
	var sum float64
	var ids int
	o.mu.Lock()
	for _, h := range o.perHot {
		if r, ok := h.perTTL(c.ttl); ok {
			sum += r
			ids++
			res.MaxPerHotKeyPerTTL = max(res.MaxPerHotKeyPerTTL, r)
		}
	}
	o.mu.Unlock()
	if ids > 0 {
		res.PerHotKeyPerTTL = sum / float64(ids)
	}
	res.HotIDsRated = ids
	res.CellQueries = cellQueries
	res.CellPGSS = -1
	if pgssBefore >= 0 && pgssAfter >= 0 {
		res.CellPGSS = pgssAfter - pgssBefore
	}
	if err0 == nil && err1 == nil {
		res.Commands = map[string]int64{}
		for k, v := range stats1 {
			if k == "info" {
				continue
			}
			if d := v.calls - stats0[k].calls; d > 0 {
				res.Commands[k] = d
				res.RedisCommands += d
			}
		}
		res.RedisCommands -= res.BaselineGets
		if res.Reads > 0 {
			res.CommandsPerRead = float64(res.RedisCommands) / float64(res.Reads)
		}
	} else {
		res.CommandsPerRead = -1
	}
	return res, nil
}

func printPeers(w io.Writer, rep *peersReport) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "strategy\tN\tround\treads\treads/s\terrors\tmisses\tof which GET found\thot reads\thot misses\torigin/hot key/TTL\tworst hot key\tsimultaneous hot\torigin queries (daemon)\torigin s (daemon)\tcell queries: counted\tpg_stat_statements\tp50\tp99\tp99.9\thot p99\tplain-hit p99\thot p99 ratio\tcmds/read\theap/instance\tvalue age p99\tmax\t")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f\t%d\t%d\t%d\t%d\t%d\t%.3f\t%.2f\t%d\t%d (%d)\t%.1f (%.1f)\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%s\t%s\t%s\t\n",
			r.Strategy, r.Instances, r.Round, r.Reads, r.ReadsPerS, r.Errors, r.Misses, r.FoundMisses, r.HotReads, r.HotMisses,
			r.PerHotKeyPerTTL, r.MaxPerHotKeyPerTTL, r.SimultaneousHot, r.OriginQueries, r.DaemonQueries,
			r.OriginTime.Seconds(), r.DaemonOriginTime.Seconds(),
			r.CellQueries, r.CellPGSS, benchload.Dur(r.Latency.P50), benchload.Dur(r.Latency.P99), benchload.Dur(r.Latency.P999),
			benchload.Dur(r.HotLatency.P99), benchload.Dur(r.Baseline.P99), ratio(r.HotLatency.P99, r.Baseline.P99), r.CommandsPerRead,
			bytesIEC(r.HeapPerInstance), benchload.Dur(r.Age.P99), benchload.Dur(r.Age.Max))
	}
	_ = tw.Flush()
	fmt.Fprintf(w, `
origin/hot key/TTL: each hot id's fetch rate, (fetches − 1) ÷ (last − first fetch start in the window) × TTL,
averaged over the hot ids with 2 fetches or more (a count over the window would round each id to 3 or 4 in 30 s,
by where the window falls against its cycle); worst hot key: the highest id's rate. misses: reads that returned a value produced by an origin query that ended after the read
began (they waited for it), whatever path they took; of which GET found: those whose first Redis GET found a value
that the library then rebuilt before answering (not counted before issue 35); hot reads, hot misses: the same for
hot ids; errors: reads that returned an error. simultaneous hot: fetches of a hot id that started while another fetch of
it was in flight. origin queries (daemon): origin queries in the window, the daemon's share in parentheses; origin s (daemon): the
seconds those queries took, summed (each sleeps --cost per id it asks for, so a batch of n ids costs n ids' work).
cell queries: origin queries the wrapper counted from before the first instance
started to after the last stopped, against pg_stat_statements' calls over the same span. p50..p99.9: every read;
hot p99: reads of hot ids, over the plain-hit p99 of the same window. cmds/read: INFO commandstats calls in the
window (scripts' inner calls included; the daemon's included; the baseline's GETs and INFO taken out) per read.
heap/instance: Go heap growth after GC with the instances alive, ÷ N (clients, pools, local caches). value age:
read end − the origin query's clock_timestamp().
`)
	for _, r := range rep.Results {
		if r.FirstError != "" {
			fmt.Fprintf(w, "%s N=%d round %d: first error: %s\n", r.Strategy, r.Instances, r.Round, r.FirstError)
		}
		if strings.Contains(r.Strategy, "keepwarm") && len(r.HotMissSamples) > 0 {
			var ms []string
			for _, m := range r.HotMissSamples {
				ms = append(ms, fmt.Sprintf("id %s at %.2fs (%s)", m.ID, m.At.Seconds(), benchload.Dur(m.Took)))
			}
			fmt.Fprintf(w, "%s N=%d round %d: hot misses: %s\n", r.Strategy, r.Instances, r.Round, strings.Join(ms, ", "))
		}
		if strings.Contains(r.Strategy, "near") {
			fmt.Fprintf(w, "%s N=%d round %d: near cache: %d reads served from memory (%.2f%% of all reads), %d bypasses\n",
				r.Strategy, r.Instances, r.Round, r.NearHits, 100*float64(r.NearHits)/float64(max(r.Reads, 1)), r.NearBypasses)
		}
		if r.HotNoGet > 0 {
			fmt.Fprintf(w, "%s N=%d round %d: hot reads that sent no Redis GET (served from process memory): %.3f%%, their p99 %v; %d hot reads sent one\n",
				r.Strategy, r.Instances, r.Round, 100*float64(r.HotNoGet)/float64(max(r.HotReads, 1)), r.HotNoGetLatency.P99, r.HotReads-r.HotNoGet)
		}
		if r.Daemon != nil {
			fmt.Fprintf(w, "%s N=%d round %d: the warmer's refreshes by result: %v\n", r.Strategy, r.Instances, r.Round, r.Daemon)
		}
		if r.CellPGSS >= 0 && r.CellPGSS != r.CellQueries {
			fmt.Fprintf(w, "%s N=%d round %d: the wrapper counted %d origin queries, pg_stat_statements %d\n", r.Strategy, r.Instances, r.Round, r.CellQueries, r.CellPGSS)
		}
	}
	printPeersSummary(w, rep)
	printNearAcceptance(w, rep)
	// The targets, for the daemon at the largest N, on the medians over the rounds.
	var best *peersSummary
	for i := range rep.Summary {
		r := &rep.Summary[i]
		if r.Strategy == "keepwarm" && (best == nil || r.Instances > best.Instances) {
			best = r
		}
	}
	if best != nil {
		if rep.Duration < 2*rep.TTL {
			fmt.Fprintf(w, "\nkeepwarm targets: not judged: the window, %v, is shorter than two TTLs, so few hot keys expired in it and the per-TTL figures above mean little\n", rep.Duration)
			return
		}
		fmt.Fprintf(w, "\nkeepwarm targets at N = %d, medians of %d round(s): origin queries per hot key per TTL %.3f (want <= 1.05) %s; hot waits %.3f%% (want 0) %s; hot p99 ratio to a plain hit %.2f (want <= 1.2) %s\n",
			best.Instances, best.Rounds, best.PerHotKeyPerTTL.Median, mark(best.PerHotKeyPerTTL.Median <= 1.05), best.HotWaitPct.Median, mark(best.HotWaitPct.Median == 0),
			best.HotP99Ratio.Median, mark(best.HotP99Ratio.Median > 0 && best.HotP99Ratio.Median <= 1.2))
	}
}

// bytesIEC formats a byte count with a binary unit.
func bytesIEC(b float64) string {
	switch a := math.Abs(b); {
	case a >= 1<<30:
		return strconv.FormatFloat(b/(1<<30), 'f', 1, 64) + " GiB"
	case a >= 1<<20:
		return strconv.FormatFloat(b/(1<<20), 'f', 1, 64) + " MiB"
	case a >= 1<<10:
		return strconv.FormatFloat(b/(1<<10), 'f', 0, 64) + " KiB"
	}
	return strconv.FormatFloat(b, 'f', 0, 64) + " B"
}

// peersSVG draws origin queries per hot key per TTL and the hot p99 ratio against N, one line per strategy: the
// medians over the rounds.
func peersSVG(rep *peersReport) []byte {
	if len(rep.Summary) == 0 { // a JSON file from before rounds: one cell per strategy and N
		rep.Summary = summarizePeers(rep)
	}
	var origin, lat []svgSeries
	ymaxO, ymaxL, xmax := 1.2, 1.5, 1.0
	for i, pc := range rep.Configs {
		so := svgSeries{name: pc.Strategy, color: palette[i%len(palette)], dashed: i >= len(palette)}
		sl := so
		for _, r := range rep.Summary {
			if r.Strategy != pc.Strategy {
				continue
			}
			x := float64(r.Instances)
			o, rt := r.PerHotKeyPerTTL.Median, r.HotP99Ratio.Median
			so.pts = append(so.pts, [2]float64{x, o})
			sl.pts = append(sl.pts, [2]float64{x, rt})
			ymaxO, ymaxL, xmax = max(ymaxO, o*1.1), max(ymaxL, rt*1.1), max(xmax, x)
		}
		origin, lat = append(origin, so), append(lat, sl)
	}
	title := fmt.Sprintf("Peers: Zipf %g over %d ids, %.0f reads/s, TTL %v", rep.Skew, rep.Keys, rep.Rate, rep.TTL)
	a := lineSVG(title+": origin queries per hot key per TTL", "app instances N", "origin queries / hot key / TTL", 0, xmax, 0, ymaxO, origin)
	b := lineSVG("Hot-key read p99 ÷ plain GET hit p99 (same window)", "app instances N", "p99 ratio", 0, xmax, 0, ymaxL, lat)
	return stackSVG(a, b)
}

// stackSVG puts whole SVG documents one above the other in one document, each keeping its own size.
func stackSVG(docs ...[]byte) []byte {
	var b strings.Builder
	h := 0
	var parts []string
	for _, d := range docs {
		s := string(d)
		dh := 0
		if _, rest, ok := strings.Cut(s, `height="`); ok {
			dh, _ = strconv.Atoi(rest[:strings.IndexByte(rest, '"')])
		}
		parts = append(parts, strings.Replace(s, "<svg ", fmt.Sprintf(`<svg y="%d" `, h), 1))
		h += dh
	}
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">`+"\n", svgW, h, svgW, h)
	for _, p := range parts {
		b.WriteString(p)
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}
