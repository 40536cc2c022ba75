package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/keepwarm/keepwarm/internal/benchload"
	"github.com/keepwarm/keepwarm/internal/redisserver"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/warmer"
)

// The scale scenario measures the warmer itself, with an in-memory Source (so PostgreSQL is not what is
// measured): memory per tracked id, refresh throughput at saturation against redis-benchmark's pipelined SET,
// Redis commands per refresh, and the CPU the daemon burns while idle with 1,000,000 tracked ids.

type scaleConfig struct {
	redisURL    string
	spawn       bool
	tracked     []int
	hot         int
	satKeys     int
	batch       int
	steadyTTL   time.Duration
	steadyWin   time.Duration
	idleWindow  time.Duration
	cpuProfile  string
	svg         string
	jsonPath    string
	valueBytes  int
	reconcile   time.Duration
	skipIdle    bool
	skipRefresh bool
	notify      bool
	skipSat     bool
	steadyHot   int
	port        int
}

func runScale(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c scaleConfig
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.redisURL, "redis", envOr("KEEPWARM_REDIS_URL", defaultRedisURL), "Redis URL, used with --spawn-redis=false")
	fs.BoolVar(&c.spawn, "spawn-redis", true, "start a private redis-server on a free loopback port, so that INFO commandstats and redis-benchmark see only this benchmark (the shared one serves other tests)")
	tracked := fs.String("tracked", "100000,1000000", "tracked-id counts to measure (ids ZADDed into the access set)")
	fs.IntVar(&c.hot, "hot", 10000, "hot set (top_n) while measuring the footprint and idle CPU")
	fs.IntVar(&c.satKeys, "saturation-keys", 100000, "keys refreshed at once for the throughput measurement")
	fs.IntVar(&c.batch, "batch-size", warmer.DefaultBatchSize, "the warmer's batch_size")
	fs.DurationVar(&c.steadyTTL, "steady-ttl", 10*time.Second, "TTL of the steady-state commands-per-refresh measurement (10,000 hot keys)")
	fs.DurationVar(&c.steadyWin, "steady-window", 40*time.Second, "how long the steady state is measured")
	fs.DurationVar(&c.reconcile, "reconcile-every", 0, "the warmer's reconcile_every in the steady state (default: the warmer's)")
	fs.DurationVar(&c.idleWindow, "idle-window", 2*time.Minute, "how long idle CPU is measured with the largest tracked count (two full access-set syncs at the default)")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the idle window to this file")
	fs.IntVar(&c.valueBytes, "value-bytes", 300, "value size written by the in-memory source")
	fs.BoolVar(&c.notify, "notifications", false, "turn keyspace notifications on in the private redis-server (notify-keyspace-events Exeg$) and in the warmer, as in production")
	fs.BoolVar(&c.skipSat, "skip-saturation", false, "skip the saturation throughput measurement (and redis-benchmark), keep the steady state")
	fs.IntVar(&c.steadyHot, "steady-hot", 0, "hot keys of the steady-state commands-per-refresh measurement (default: --hot)")
	fs.IntVar(&c.port, "port", 0, "port of the private redis-server (0: a free one)")
	fs.BoolVar(&c.skipIdle, "skip-footprint", false, "skip the footprint and idle CPU measurements")
	fs.BoolVar(&c.skipRefresh, "skip-refresh", false, "skip the throughput and commands-per-refresh measurements")
	fs.StringVar(&c.svg, "svg", "", "write the plot (SVG) to this file")
	fs.StringVar(&c.jsonPath, "json", "", "write the results as JSON to this file")
	if err := parse(fs, args); err != nil {
		return err
	}
	if c.notify && !c.spawn {
		return usageError{fmt.Errorf("--notifications changes notify-keyspace-events, so it needs the private redis-server (--spawn-redis)")}
	}
	if c.steadyHot == 0 {
		c.steadyHot = c.hot
	}
	for _, s := range strings.Split(*tracked, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return usageError{fmt.Errorf("--tracked: %q is not a positive count", s)}
		}
		c.tracked = append(c.tracked, n)
	}
	rep, err := scale(ctx, c, stdout, stderr)
	if err != nil {
		return err
	}
	return writeResults(c.svg, c.jsonPath, rep, scaleSVG, stderr)
}

type scaleReport struct {
	Machine    machine           `json:"machine"`
	Footprint  []footprintResult `json:"footprint"`
	Idle       *idleResult       `json:"idle,omitempty"`
	Saturation *refreshResult    `json:"saturation,omitempty"`
	Steady     *refreshResult    `json:"steady,omitempty"`
	SetLimit   float64           `json:"redis_benchmark_set_per_s"`
}

type footprintResult struct {
	Tracked       int     `json:"tracked"`
	Hot           int     `json:"hot"`
	HeapDelta     int64   `json:"heap_inuse_delta_bytes"`
	RSSDelta      int64   `json:"rss_delta_bytes"`
	HeapPerKey    float64 `json:"heap_bytes_per_key"`
	RSSPerKey     float64 `json:"rss_bytes_per_key"`
	SyncSeconds   float64 `json:"first_sync_s"`
	TrackedStatus int     `json:"tracked_status"`
}

type idleResult struct {
	Tracked   int     `json:"tracked"`
	Window    float64 `json:"window_s"`
	CPU       float64 `json:"cpu_s"`
	CoreShare float64 `json:"core_share"`
}

type refreshResult struct {
	Keys          int64            `json:"refreshes"`
	Seconds       float64          `json:"seconds"`
	PerSecond     float64          `json:"keys_per_s"`
	TopLevel      int64            `json:"top_level_commands"`
	RoundTrips    int64            `json:"round_trips"`
	ServerCalls   int64            `json:"server_calls"` // INFO commandstats, scripts' inner calls included
	ByCommand     map[string]int64 `json:"by_command"`
	TopLevelByCmd map[string]int64 `json:"top_level_by_command"`
	Reconcile     time.Duration    `json:"reconcile_every_ns"`
	TTL           time.Duration    `json:"ttl_ns"`
}

// cmdCounter is a go-redis hook that counts the commands and round trips the warmer's client sends.
type cmdCounter struct {
	cmds, trips atomic.Int64
	by          [32]atomic.Int64
	names       []string
}

func newCmdCounter() *cmdCounter {
	return &cmdCounter{names: []string{"set", "pttl", "evalsha", "eval", "script", "zrevrange", "zrevrangebyscore", "zunionstore", "zremrangebyrank", "zremrangebyscore", "get", "del", "other"}}
}

func (h *cmdCounter) count(cmd redis.Cmder) {
	h.cmds.Add(1)
	name := cmd.Name()
	for i, n := range h.names {
		if n == name || n == "other" {
			h.by[i].Add(1)
			return
		}
	}
}
func (h *cmdCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.trips.Add(1)
		h.count(cmd)
		return next(ctx, cmd)
	}
}
func (h *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.trips.Add(1)
		for _, c := range cmds {
			h.count(c)
		}
		return next(ctx, cmds)
	}
}
func (h *cmdCounter) snapshot() (cmds, trips int64, by map[string]int64) {
	by = map[string]int64{}
	for i, n := range h.names {
		if v := h.by[i].Load(); v > 0 {
			by[n] = v
		}
	}
	return h.cmds.Load(), h.trips.Load(), by
}

// memSource is an in-memory Source: every id has the same value. It counts the rows it returned, so that the
// harness need not poll the warmer's Status (which sorts every hot key) while measuring.
type memSource struct {
	val  []byte
	rows *atomic.Int64
}

func newMemSource(n int) memSource { return memSource{val: make([]byte, n), rows: new(atomic.Int64)} }

func (m memSource) Fetch(_ context.Context, ids []string) (map[string][]byte, []string, error) {
	out := make(map[string][]byte, len(ids))
	for _, id := range ids {
		out[id] = m.val
	}
	m.rows.Add(int64(len(ids)))
	return out, nil, nil
}

func scale(ctx context.Context, c scaleConfig, stdout, stderr io.Writer) (*scaleReport, error) {
	url := c.redisURL
	if c.spawn {
		srv, err := redisserver.StartPort(ctx, c.port)
		if err != nil {
			return nil, err
		}
		defer srv.Stop()
		// Generous bounds: on a loaded machine a 100,000-command pipeline can take longer than go-redis's 3 s default.
		url = srv.URL + "?read_timeout=30s&write_timeout=30s"
		if c.notify {
			admin, err := benchload.NewRedis(ctx, url, 1)
			if err != nil {
				return nil, err
			}
			err = admin.ConfigSet(ctx, "notify-keyspace-events", "Exeg$").Err()
			admin.Close()
			if err != nil {
				return nil, err
			}
		}
		fmt.Fprintf(stderr, "scale: private redis-server at %s\n", url)
	}
	rdb, err := benchload.NewRedis(ctx, url, 0)
	if err != nil {
		return nil, err
	}
	defer rdb.Close()
	rep := &scaleReport{Machine: describeMachine(ctx, rdb, nil)}
	fmt.Fprintln(stdout, rep.Machine, "(PostgreSQL not used: the Source is in memory)")
	if !c.skipIdle {
		for i, n := range c.tracked {
			last := i == len(c.tracked)-1
			fr, idle, err := footprint(ctx, c, url, n, last, stderr)
			if err != nil {
				return nil, err
			}
			rep.Footprint = append(rep.Footprint, *fr)
			if idle != nil {
				rep.Idle = idle
			}
		}
	}
	if !c.skipRefresh {
		if !c.skipSat {
			fmt.Fprintf(stderr, "scale: redis-benchmark -P 64 -t set -d 300\n")
			if rep.SetLimit, err = redisBenchmarkSet(ctx, url); err != nil {
				return nil, err
			}
			if rep.Saturation, err = saturation(ctx, c, url, stderr); err != nil {
				return nil, err
			}
		}
		if rep.Steady, err = steady(ctx, c, url, stderr); err != nil {
			return nil, err
		}
	}
	printScale(stdout, c, rep)
	return rep, nil
}

// redisBenchmarkSet runs `redis-benchmark -P 64 -t set -d 300 -q` against url and returns SETs per second.
func redisBenchmarkSet(ctx context.Context, url string) (float64, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return 0, err
	}
	host, port, _ := strings.Cut(opt.Addr, ":")
	out, err := exec.CommandContext(ctx, "redis-benchmark", "-h", host, "-p", port, "-P", "64", "-t", "set", "-d", "300",
		"-n", "2000000", "-q").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark (apt-get install redis-tools): %w\n%s", err, out)
	}
	m := regexp.MustCompile(`SET: ([\d.]+) requests per second`).FindStringSubmatch(string(out))
	if m == nil {
		return 0, fmt.Errorf("redis-benchmark: no SET rate in %q", out)
	}
	return strconv.ParseFloat(m[1], 64)
}

func memNow() (heap, rss int64) {
	runtime.GC()
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			rss = kb << 10
		}
	}
	return int64(ms.HeapInuse), rss
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchKeys(prefix string) *lockstep.Keys {
	k, err := lockstep.NewKeys(prefix+"${id}", "", "", "")
	if err != nil {
		panic(err) // a constant template: programmer error
	}
	return k
}

// footprint fills the access set with n ids, lets a warmer (top_n = hot, max_tracked = n) track them all, and
// measures the heap and RSS it holds; for the largest n it then measures idle CPU.
func footprint(ctx context.Context, c scaleConfig, url string, n int, idle bool, stderr io.Writer) (*footprintResult, *idleResult, error) {
	rdb, err := benchload.NewRedis(ctx, url, 0)
	if err != nil {
		return nil, nil, err
	}
	defer rdb.Close()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		return nil, nil, err
	}
	name := "footprint"
	access := lockstep.AccessKey(name)
	fmt.Fprintf(stderr, "scale: ZADD %d ids into %s\n", n, access)
	r := rand.New(rand.NewPCG(1, uint64(n)))
	for start := 0; start < n; start += 10000 {
		pipe := rdb.Pipeline()
		zs := make([]redis.Z, 0, 10000)
		for i := start; i < min(start+10000, n); i++ {
			// Zipf-like scores: a few ids score high, most score near 1.
			zs = append(zs, redis.Z{Score: 1 / (r.Float64() + 1e-6), Member: strconv.Itoa(i)})
		}
		pipe.ZAdd(ctx, access, zs...)
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, nil, err
		}
	}
	h0, rss0 := memNow()
	w, err := warmer.New(rdb, warmer.Config{Logger: slog.New(slog.DiscardHandler), Notifications: c.notify, Keyspaces: []warmer.KeyspaceConfig{{
		Name: name, Keys: benchKeys("fp:"), Src: newMemSource(c.valueBytes), TTL: time.Hour, Jitter: 0.1,
		TopN: c.hot, MaxTracked: n, DecayHalfLife: time.Hour,
	}}})
	if err != nil {
		return nil, nil, err
	}
	start := time.Now()
	stop := startWarmer(ctx, w)
	defer stop()
	var st warmer.KeyspaceStatus
	for {
		if s := w.Status(1); len(s) == 1 {
			st = s[0]
		}
		if st.Tracked >= n && st.Refreshes[warmer.ResultOK] >= int64(c.hot) {
			break
		}
		if time.Since(start) > 5*time.Minute || ctx.Err() != nil {
			return nil, nil, fmt.Errorf("footprint %d: tracked %d, refreshed %d after %v", n, st.Tracked, st.Refreshes[warmer.ResultOK], time.Since(start))
		}
		time.Sleep(250 * time.Millisecond)
	}
	synced := time.Since(start)
	time.Sleep(3 * time.Second) // let the refresh batches and polls settle
	h1, rss1 := memNow()
	fr := &footprintResult{Tracked: n, Hot: c.hot, HeapDelta: h1 - h0, RSSDelta: rss1 - rss0,
		HeapPerKey: float64(h1-h0) / float64(n), RSSPerKey: float64(rss1-rss0) / float64(n), SyncSeconds: synced.Seconds(),
		TrackedStatus: st.Tracked}
	fmt.Fprintf(stderr, "scale: %d tracked: heap in-use +%d B (%.0f B/id), RSS +%d B (%.0f B/id)\n", n, fr.HeapDelta, fr.HeapPerKey, fr.RSSDelta, fr.RSSPerKey)
	if !idle {
		return fr, nil, nil
	}
	fmt.Fprintf(stderr, "scale: idle CPU with %d tracked ids for %v\n", n, c.idleWindow)
	if c.cpuProfile != "" {
		f, err := os.Create(c.cpuProfile)
		if err != nil {
			return nil, nil, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, nil, err
		}
		defer pprof.StopCPUProfile()
	}
	cpu0, t0 := cpuTime(), time.Now()
	sleepCtx(ctx, c.idleWindow)
	cpu, win := cpuTime()-cpu0, time.Since(t0)
	if c.cpuProfile != "" {
		pprof.StopCPUProfile()
	}
	return fr, &idleResult{Tracked: n, Window: win.Seconds(), CPU: cpu.Seconds(), CoreShare: cpu.Seconds() / win.Seconds()}, nil
}

// commandstats returns INFO commandstats' calls by command.
func commandstats(ctx context.Context, rdb *redis.Client) (map[string]int64, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		num, _, _ := strings.Cut(rest, ",")
		n, _ := strconv.ParseInt(num, 10, 64)
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out, nil
}

func statsDelta(a, b map[string]int64) (total int64, by map[string]int64) {
	by = map[string]int64{}
	for k, v := range b {
		if d := v - a[k]; d > 0 && k != "info" {
			by[k] = d
			total += d
		}
	}
	return total, by
}

// pinnedRun is the set-up that saturation and steady share, on the private Redis at url, flushed first: an admin
// client for INFO, and a warmer keeping the pinned ids 0..n-1 of ks warm on a client of its own whose commands
// hook counts.
type pinnedRun struct {
	admin, rdb *redis.Client
	hook       *cmdCounter
	w          *warmer.Warmer
}

// newPinnedRun flushes the Redis at url and builds the warmer of ks with Pinned set to n ids; Run is the caller's.
func newPinnedRun(ctx context.Context, c scaleConfig, url string, ks warmer.KeyspaceConfig, n int) (_ *pinnedRun, err error) {
	p := &pinnedRun{}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if p.admin, err = benchload.NewRedis(ctx, url, 0); err != nil {
		return nil, err
	}
	if err := p.admin.FlushAll(ctx).Err(); err != nil {
		return nil, err
	}
	if p.rdb, err = benchload.NewRedis(ctx, url, 0); err != nil {
		return nil, err
	}
	p.hook = newCmdCounter()
	p.rdb.AddHook(p.hook)
	ks.Pinned = make([]string, n)
	for i := range ks.Pinned {
		ks.Pinned[i] = strconv.Itoa(i)
	}
	ks.BatchSize = c.batch
	p.w, err = warmer.New(p.rdb, warmer.Config{Logger: slog.New(slog.DiscardHandler), Notifications: c.notify, Keyspaces: []warmer.KeyspaceConfig{ks}})
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (p *pinnedRun) close() {
	for _, c := range []*redis.Client{p.rdb, p.admin} {
		if c != nil {
			c.Close()
		}
	}
}

// saturation pins satKeys absent keys so that all fall due at once, and measures how fast the warmer refreshes
// them, and what that costs Redis.
func saturation(ctx context.Context, c scaleConfig, url string, stderr io.Writer) (*refreshResult, error) {
	src := newMemSource(c.valueBytes)
	p, err := newPinnedRun(ctx, c, url, warmer.KeyspaceConfig{Name: "saturation", Keys: benchKeys("sat:"), Src: src,
		TTL: time.Hour, Jitter: 0.1, StaleTTL: 0}, c.satKeys)
	if err != nil {
		return nil, err
	}
	defer p.close()
	admin, hook, w := p.admin, p.hook, p.w
	fmt.Fprintf(stderr, "scale: refreshing %d keys at once (batch_size %d)\n", c.satKeys, c.batch)
	s0, err := commandstats(ctx, admin)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	stop := startWarmer(ctx, w)
	// Wait for the source to have served every key (a cheap counter), then for the last publishes (Status sorts
	// copies every hot key on the keyspace's loop, a message that waits for the loop, so it is only asked once the
	// fetches are done).
	var ok int64
	for ok < int64(c.satKeys) {
		if src.rows.Load() >= int64(c.satKeys) {
			if st := w.Status(1); len(st) == 1 {
				ok = st[0].Refreshes[warmer.ResultOK]
			}
		}
		if time.Since(start) > 5*time.Minute || ctx.Err() != nil {
			stop()
			return nil, fmt.Errorf("saturation: %d of %d refreshed after %v", ok, c.satKeys, time.Since(start))
		}
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(start)
	cmds, trips, by := hook.snapshot()
	s1, err := commandstats(ctx, admin)
	stop()
	if err != nil {
		return nil, err
	}
	total, byCmd := statsDelta(s0, s1)
	return &refreshResult{Keys: ok, Seconds: took.Seconds(), PerSecond: float64(ok) / took.Seconds(), TopLevel: cmds,
		RoundTrips: trips, ServerCalls: total, ByCommand: byCmd, TopLevelByCmd: by, TTL: time.Hour}, nil
}

// steady keeps c.hot pinned keys warm with a short TTL and measures, over a window of several TTLs, the Redis
// commands per refresh including everything else the warmer sends meanwhile (polls, PTTL reconciliation).
func steady(ctx context.Context, c scaleConfig, url string, stderr io.Writer) (*refreshResult, error) {
	p, err := newPinnedRun(ctx, c, url, warmer.KeyspaceConfig{Name: "steady", Keys: benchKeys("steady:"),
		Src: newMemSource(c.valueBytes), TTL: c.steadyTTL, Jitter: 0.1, ReconcileEvery: c.reconcile}, c.steadyHot)
	if err != nil {
		return nil, err
	}
	defer p.close()
	admin, hook, w := p.admin, p.hook, p.w
	reconcile := c.reconcile
	if reconcile == 0 {
		reconcile = warmer.DefaultReconcileEvery
	}
	fmt.Fprintf(stderr, "scale: steady state, %d keys, TTL %v, reconcile every %v, notifications %v, for %v\n", c.steadyHot, c.steadyTTL, reconcile, c.notify, c.steadyWin)
	stop := startWarmer(ctx, w)
	defer stop()
	// Skip the first fill and one TTL, then measure.
	if !sleepCtx(ctx, c.steadyTTL+2*time.Second) {
		return nil, ctx.Err()
	}
	okAt := func() int64 {
		if st := w.Status(1); len(st) == 1 {
			return st[0].Refreshes[warmer.ResultOK]
		}
		return 0
	}
	s0, err := commandstats(ctx, admin)
	if err != nil {
		return nil, err
	}
	ok0 := okAt()
	c0, t0, by0 := hook.snapshot()
	start := time.Now()
	sleepCtx(ctx, c.steadyWin)
	c1, t1, by1 := hook.snapshot()
	ok1 := okAt()
	took := time.Since(start)
	s1, err := commandstats(ctx, admin)
	if err != nil {
		return nil, err
	}
	total, byCmd := statsDelta(s0, s1)
	by := map[string]int64{}
	for k, v := range by1 {
		if d := v - by0[k]; d > 0 {
			by[k] = d
		}
	}
	n := ok1 - ok0
	return &refreshResult{Keys: n, Seconds: took.Seconds(), PerSecond: float64(n) / took.Seconds(), TopLevel: c1 - c0,
		RoundTrips: t1 - t0, ServerCalls: total, ByCommand: byCmd, TopLevelByCmd: by, Reconcile: reconcile, TTL: c.steadyTTL}, nil
}

func perKey(n, keys int64) float64 { return float64(n) / float64(max(keys, 1)) }

func printScale(w io.Writer, c scaleConfig, rep *scaleReport) {
	if len(rep.Footprint) > 0 {
		fmt.Fprintln(w, "\nfootprint (hot set", c.hot, "of the tracked ids; heap = runtime HeapInuse after GC; RSS = VmRSS after debug.FreeOSMemory):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "tracked ids\tfirst sync\theap in-use delta\tbytes/id (heap)\tRSS delta\tbytes/id (RSS)\ttarget\t")
		for _, f := range rep.Footprint {
			fmt.Fprintf(tw, "%d\t%.1fs\t%.1f MiB\t%.0f\t%.1f MiB\t%.0f\t<= 200 B/id %s\t\n", f.Tracked, f.SyncSeconds,
				float64(f.HeapDelta)/(1<<20), f.HeapPerKey, float64(f.RSSDelta)/(1<<20), f.RSSPerKey, mark(f.HeapPerKey <= 200 && f.RSSPerKey <= 200))
		}
		_ = tw.Flush()
	}
	if rep.Idle != nil {
		fmt.Fprintf(w, "\nidle CPU with %d tracked ids (no reads, TTL 1h): %.2f s of CPU in %.0f s = %.2f%% of a core (target < 5%%) %s\n",
			rep.Idle.Tracked, rep.Idle.CPU, rep.Idle.Window, 100*rep.Idle.CoreShare, mark(rep.Idle.CoreShare < 0.05))
	}
	if s := rep.Saturation; s != nil {
		fmt.Fprintf(w, "\nrefresh throughput at saturation: %d keys in %.2f s = %.0f keys/s; redis-benchmark -P 64 -t set -d 300: %.0f SET/s (ratio %.3f)\n",
			s.Keys, s.Seconds, s.PerSecond, rep.SetLimit, s.PerSecond/rep.SetLimit)
		fmt.Fprintf(w, "  commands per refresh (first pass of new hot keys): sent %.2f (%v) in %.3f round trips; executed by Redis %.2f incl. the scripts' inner calls (%v)\n",
			perKey(s.TopLevel, s.Keys), s.TopLevelByCmd, perKey(s.RoundTrips, s.Keys), perKey(s.ServerCalls, s.Keys), s.ByCommand)
	}
	if s := rep.Steady; s != nil {
		fmt.Fprintf(w, "\nsteady state, %d hot keys, TTL %v, reconcile every %v, notifications %v: %d refreshes in %.0f s\n", c.steadyHot, s.TTL, s.Reconcile, c.notify, s.Keys, s.Seconds)
		fmt.Fprintf(w, "  commands per refresh, amortised over everything the warmer sent: %.2f (%v) in %.3f round trips (target <= 3 %s); executed by Redis %.2f (%v)\n",
			perKey(s.TopLevel, s.Keys), s.TopLevelByCmd, perKey(s.RoundTrips, s.Keys), mark(perKey(s.TopLevel, s.Keys) <= 3),
			perKey(s.ServerCalls, s.Keys), s.ByCommand)
	}
}

func scaleSVG(rep *scaleReport) []byte {
	var bars []svgBar
	for _, f := range rep.Footprint {
		bars = append(bars, svgBar{label: fmt.Sprintf("%d tracked: heap B/id", f.Tracked), value: f.HeapPerKey, color: palette[0], text: fmt.Sprintf("%.0f", f.HeapPerKey)})
		bars = append(bars, svgBar{label: fmt.Sprintf("%d tracked: RSS B/id", f.Tracked), value: f.RSSPerKey, color: palette[4], text: fmt.Sprintf("%.0f", f.RSSPerKey)})
	}
	bars = append(bars, svgBar{label: "target", value: 200, color: palette[1], text: "200 B/id"})
	return barSVG("keepwarm warmer: memory per tracked id (hot set 10,000)", "bytes per tracked id", bars)
}
