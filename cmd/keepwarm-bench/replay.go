package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/klauspost/compress/zstd"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/benchload"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/sources/postgres"
	"github.com/keepwarm/keepwarm/warmer"
)

// The replay scenarios (`trace` and `zipf`) read many keys through lockstep clients, with the warmer running,
// at a fixed rate, and compare the daemon's online choice of hot keys with an oracle that knows the whole
// workload in advance and keeps its static top K warm with the same refresh budget (K keys).

type replayConfig struct {
	services
	kind       string // "trace" or "zipf"
	tracePath  string
	skew       float64
	scan       float64
	keys       int
	reads      int
	limit      int
	rate       float64
	goroutines int
	clients    int
	ttl        time.Duration
	cost       time.Duration
	topK       int
	halfLife   time.Duration
	modes      []string
	svg        string
	jsonPath   string
	seed       uint64
}

// defaultTracePath is the OLTP trace in shared/, beside the repository: ../shared relative to the module root
// (where CI and the developers' machines have it), or, in a scratch clone of a local repository (`git clone .
// /tmp/x`), beside the repository it was cloned from.
func defaultTracePath() string {
	rel := filepath.Join("shared", "data", "traces", "OLTP.lis.zst")
	root := benchload.ModuleRoot()
	path := filepath.Join(root, "..", rel)
	if fileExists(path) {
		return path
	}
	out, err := exec.Command("git", "-C", root, "config", "--get", "remote.origin.url").Output()
	if origin := strings.TrimSpace(string(out)); err == nil && filepath.IsAbs(origin) {
		if alt := filepath.Join(origin, "..", rel); fileExists(alt) {
			return alt
		}
	}
	return path
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func runTrace(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runReplay(ctx, "trace", args, stdout, stderr)
}

func runZipf(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runReplay(ctx, "zipf", args, stdout, stderr)
}

func parseReplay(kind string, args []string, stderr io.Writer) (replayConfig, error) {
	c := replayConfig{kind: kind}
	fs := flag.NewFlagSet(kind, flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.services.flags(fs)
	if kind == "trace" {
		fs.StringVar(&c.tracePath, "trace", defaultTracePath(), "the OLTP trace (.lis or .lis.zst; ARC, Megiddo and Modha, FAST 2003)")
	} else {
		fs.Float64Var(&c.skew, "skew", 1.1, "Zipf exponent s (> 1)")
		fs.IntVar(&c.keys, "keys", 186880, "distinct ids")
		fs.IntVar(&c.reads, "reads", 914145, "reads to generate")
		fs.Float64Var(&c.scan, "scan", 0, "fraction of reads, in [0, 1), that are a sequential sweep of ids read once and never again (scan pollution)")
	}
	fs.IntVar(&c.limit, "limit", 0, "replay only the first N reads (0: all)")
	fs.Float64Var(&c.rate, "rate", 3000, "reads per second (planned; the achieved rate is reported)")
	fs.IntVar(&c.goroutines, "goroutines", 64, "concurrent readers, each with its own lockstep client")
	fs.IntVar(&c.clients, "clients", 4, "Redis connection pools the readers share (app processes)")
	fs.DurationVar(&c.ttl, "ttl", 0, "cache TTL of every key (default: the replay's length / 30)")
	fs.DurationVar(&c.cost, "cost", time.Millisecond, "recompute cost: each origin query runs pg_sleep(cost) once")
	fs.IntVar(&c.topK, "top-k", 10000, "refresh budget: the warmer's top_n, and the oracle's static set size")
	fs.DurationVar(&c.halfLife, "half-life", 0, "the warmer's decay_half_life (default: the replay's length / 6)")
	modes := fs.String("modes", "keepwarm,oracle", "what to replay, in order: keepwarm (the warmer's online top_n), oracle (static top K pinned)")
	fs.StringVar(&c.svg, "svg", "", "write the warm-fraction plot (SVG) to this file")
	fs.StringVar(&c.jsonPath, "json", "", "write the results as JSON to this file")
	fs.Uint64Var(&c.seed, "seed", 1, "random seed (zipf ids)")
	if err := parse(fs, args); err != nil {
		return c, err
	}
	for _, m := range strings.Split(*modes, ",") {
		if m != "keepwarm" && m != "oracle" {
			return c, usageError{fmt.Errorf("--modes: unknown mode %q (keepwarm, oracle)", m)}
		}
		c.modes = append(c.modes, m)
	}
	switch {
	case c.rate <= 0 || c.goroutines < 1 || c.clients < 1 || c.topK < 1:
		return c, usageError{errors.New("--rate, --goroutines, --clients and --top-k must be > 0")}
	case kind == "zipf" && (c.skew <= 1 || c.keys < 2 || c.reads < 1 || !(c.scan >= 0 && c.scan < 1)):
		return c, usageError{errors.New("--skew must be > 1, --keys >= 2, --reads >= 1, --scan in [0, 1)")}
	}
	return c, nil
}

// workload is a read sequence over distinct ids.
type workload struct {
	name string
	ids  []string // index → id (decimal integers)
	seq  []int32  // reads, as indices into ids
	note string
}

// loadTrace reads an ARC trace: lines "start_block count ignore request_number". Each request reads count
// blocks from start_block; every block is one record id. (In OLTP.lis every count is 1, so expanding count and
// using start_block alone give the same 914,145 reads over 186,880 ids; the code expands it for other traces.)
func loadTrace(path string, limit int) (*workload, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace (pass --trace; CI reads it from ../shared beside the repository): %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".zst") {
		zr, err := zstd.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("trace %s: %w", path, err)
		}
		defer zr.Close()
		r = zr
	}
	w := &workload{name: filepath.Base(path)}
	index := map[int64]int32{}
	sc := bufio.NewScanner(r)
	line, requests, expanded := 0, 0, 0
	for sc.Scan() {
		line++
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if len(fields) < 2 {
			return nil, fmt.Errorf("trace %s:%d: want 'start_block count ...', got %q", path, line, sc.Text())
		}
		start, err1 := strconv.ParseInt(fields[0], 10, 64)
		count, err2 := strconv.ParseInt(fields[1], 10, 64)
		if err1 != nil || err2 != nil || count < 1 {
			return nil, fmt.Errorf("trace %s:%d: bad start_block or count in %q", path, line, sc.Text())
		}
		requests++
		if count > 1 {
			expanded++
		}
		for b := start; b < start+count; b++ {
			i, ok := index[b]
			if !ok {
				i = int32(len(w.ids))
				index[b] = i
				w.ids = append(w.ids, strconv.FormatInt(b, 10))
			}
			w.seq = append(w.seq, i)
		}
		if limit > 0 && len(w.seq) >= limit {
			w.seq = w.seq[:limit]
			break
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	w.note = fmt.Sprintf("%s: %d requests (%d with count > 1, expanded into one read per block), %d reads over %d distinct ids",
		w.name, requests, expanded, len(w.seq), len(w.ids))
	return w, nil
}

// zipfWorkload draws reads from a Zipf(s) distribution over keys ids; popularity is shuffled over the ids so it
// does not follow id order. With scan > 0, each read is instead, with probability scan, the next id of a
// sequential sweep over ids keys, keys+1, ... that are read once and never again: a batch job or a crawler
// interleaved with the Zipf traffic, the scan pollution that ARC (Megiddo and Modha, FAST 2003) and TinyLFU
// (Einziger et al., ACM ToS 2017) resist.
func zipfWorkload(skew float64, keys, reads int, scan float64, seed uint64) *workload {
	r := rand.New(rand.NewPCG(seed, 7))
	z := rand.NewZipf(r, skew, 1, uint64(keys-1))
	perm := r.Perm(keys)
	name := fmt.Sprintf("zipf s=%g", skew)
	if scan > 0 {
		name += fmt.Sprintf(" scan=%g", scan)
	}
	w := &workload{name: name, ids: make([]string, keys), seq: make([]int32, reads)}
	for i := range w.ids {
		w.ids[i] = strconv.Itoa(i)
	}
	seen := make([]bool, keys)
	distinct, scanned := 0, 0
	for i := range w.seq {
		if scan > 0 && r.Float64() < scan {
			w.seq[i] = int32(len(w.ids))
			w.ids = append(w.ids, strconv.Itoa(len(w.ids)))
			scanned++
			continue
		}
		id := int32(perm[z.Uint64()])
		w.seq[i] = id
		if !seen[id] {
			seen[id] = true
			distinct++
		}
	}
	w.note = fmt.Sprintf("%s: %d reads over %d ids (%d distinct ids read); %d reads of a sequential scan, each of an id read once",
		name, reads, len(w.ids), distinct+scanned, scanned)
	return w
}

// topK returns the k most-read indices of seq (ties by first index), and the reads they cover.
func topK(seq []int32, n, k int) ([]int32, int) {
	counts := make([]int32, n)
	for _, i := range seq {
		counts[i]++
	}
	idx := make([]int32, n)
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortStableFunc(idx, func(a, b int32) int { return int(counts[b] - counts[a]) })
	k = min(k, n)
	covered := 0
	for _, i := range idx[:k] {
		covered += int(counts[i])
	}
	return idx[:k], covered
}

type replayReport struct {
	Machine    machine         `json:"machine"`
	Workload   string          `json:"workload"`
	Reads      int             `json:"reads"`
	IDs        int             `json:"ids"`
	Rate       float64         `json:"rate"`
	TTL        time.Duration   `json:"ttl_ns"`
	Cost       time.Duration   `json:"cost_ns"`
	TopK       int             `json:"top_k"`
	TopKShare  float64         `json:"top_k_share"` // fraction of reads on the static top K
	HalfLife   time.Duration   `json:"half_life_ns"`
	Results    []replayResult  `json:"results"`
	RefreshAll *refreshAllStat `json:"refresh_all_simulated"`
}

type replayResult struct {
	Mode            string    `json:"mode"`
	Reads           int       `json:"reads"`
	Elapsed         float64   `json:"elapsed_s"`
	Hits            int       `json:"hits"`
	Misses          int       `json:"misses"`
	Errors          int       `json:"errors"`
	FirstError      string    `json:"first_error,omitempty"`
	AppQueries      int64     `json:"app_queries"`
	DaemonQueries   int64     `json:"daemon_queries"`
	DaemonRows      int64     `json:"daemon_refreshes"`
	Judged          int64     `json:"judged_refreshes"`
	Wasted          int64     `json:"wasted_refreshes"`
	PGSSApp         int64     `json:"pg_stat_statements_app"`
	PGSSDaemon      int64     `json:"pg_stat_statements_daemon"`
	HotExpired      int64     `json:"hot_expired"`
	FeedbackJudged  int64     `json:"feedback_judged"` // the daemon's own refresh feedback (KeyspaceStatus)
	FeedbackWasted  int64     `json:"feedback_wasted"`
	MeanHot         float64   `json:"mean_hot"` // the hot set's size, averaged over the replay's samples of it
	WarmByBucket    []float64 `json:"warm_by_bucket"`
	BucketSeconds   float64   `json:"bucket_s"`
	Latency         latencySummary
	daemonRefreshes map[string]int64
}

func (r replayResult) warm() float64 { return float64(r.Hits) / float64(max(r.Reads, 1)) }

// refreshAllStat is a daemon that refreshes every id it has ever seen, simulated on the same read times.
type refreshAllStat struct {
	Refreshes int64   `json:"refreshes"`
	Wasted    int64   `json:"wasted"`
	Warm      float64 `json:"warm"`
}

func runReplay(ctx context.Context, kind string, args []string, stdout, stderr io.Writer) error {
	c, err := parseReplay(kind, args, stderr)
	if err != nil {
		return err
	}
	rep, err := replay(ctx, c, stdout, stderr)
	if err != nil {
		return err
	}
	return writeResults(c.svg, c.jsonPath, rep, replaySVG, stderr)
}

type replayEnv struct {
	c        replayConfig
	w        *workload
	byID     map[string]int32
	run      string
	table    string // schema-qualified
	pool     *pgxpool.Pool
	dpool    *pgxpool.Pool
	apps     []*redis.Client
	daemon   *redis.Client
	appQ     string
	daemonQ  string
	log      *slog.Logger
	stderr   io.Writer
	oracle   []int32
	duration time.Duration
}

func replay(ctx context.Context, c replayConfig, stdout, stderr io.Writer) (*replayReport, error) {
	var w *workload
	var err error
	if c.kind == "trace" {
		if w, err = loadTrace(c.tracePath, c.limit); err != nil {
			return nil, err
		}
	} else {
		n := c.reads
		if c.limit > 0 {
			n = min(n, c.limit)
		}
		w = zipfWorkload(c.skew, c.keys, n, c.scan, c.seed)
	}
	e := &replayEnv{c: c, w: w, run: strconv.FormatInt(time.Now().UnixNano(), 36), log: slog.New(slog.DiscardHandler), stderr: stderr}
	e.duration = time.Duration(float64(len(w.seq)) / c.rate * float64(time.Second))
	if c.ttl == 0 {
		c.ttl = (e.duration / 30).Round(100 * time.Millisecond)
		e.c.ttl = c.ttl
	}
	if c.halfLife == 0 {
		c.halfLife = (e.duration / 6).Round(time.Second)
		e.c.halfLife = c.halfLife
	}
	e.byID = make(map[string]int32, len(w.ids))
	for i, id := range w.ids {
		e.byID[id] = int32(i)
	}
	var covered int
	e.oracle, covered = topK(w.seq, len(w.ids), c.topK)

	if e.pool, err = benchload.NewPool(ctx, c.postgresURL, 16); err != nil {
		return nil, err
	}
	defer e.pool.Close()
	if e.dpool, err = benchload.NewPool(ctx, c.postgresURL, 6); err != nil {
		return nil, err
	}
	defer e.dpool.Close()
	per := c.goroutines/c.clients + 4
	for range c.clients {
		rdb, err := benchload.NewRedis(ctx, c.redisURL, per)
		if err != nil {
			return nil, err
		}
		defer rdb.Close()
		e.apps = append(e.apps, rdb)
	}
	if e.daemon, err = benchload.NewRedis(ctx, c.redisURL, 0); err != nil {
		return nil, err
	}
	defer e.daemon.Close()
	if err := e.setupDB(ctx); err != nil {
		return nil, err
	}
	rep := &replayReport{Machine: describeMachine(ctx, e.daemon, e.pool), Workload: w.note, Reads: len(w.seq), IDs: len(w.ids),
		Rate: c.rate, TTL: c.ttl, Cost: c.cost, TopK: c.topK, TopKShare: float64(covered) / float64(len(w.seq)), HalfLife: c.halfLife}
	fmt.Fprintln(stdout, rep.Machine)
	fmt.Fprintf(stdout, "%s\nreplay at %.0f reads/s (%v), %d readers over %d connection pools; TTL %v (jitter 0.1), origin cost pg_sleep(%v) per query; refresh budget K = %d ids (%.1f%% of reads); decay half-life %v\n",
		w.note, c.rate, e.duration.Round(time.Second), c.goroutines, c.clients, c.ttl, c.cost, c.topK, 100*rep.TopKShare, c.halfLife)
	for _, m := range c.modes {
		fmt.Fprintf(stderr, "%s: replaying with %s\n", c.kind, m)
		res, err := e.runMode(ctx, m)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m, err)
		}
		rep.Results = append(rep.Results, *res)
	}
	// The refresh-all daemon is simulated on the replay's planned read times (read i at i/rate).
	n := len(w.seq)
	at := make([]int64, n)
	interval := float64(time.Second) / c.rate
	for i := range at {
		at[i] = int64(float64(i) * interval)
	}
	rep.RefreshAll = refreshAll(len(w.ids), w.seq, at, c.ttl, int64(float64(n)*interval))
	printReplay(stdout, rep, e)
	return rep, nil
}

// setupDB creates one row per id (id bigint, a ~100-byte value) and a view the daemon reads through, so that
// pg_stat_statements counts the daemon's queries apart from the apps'.
func (e *replayEnv) setupDB(ctx context.Context) error {
	s := ident(e.c.schema)
	name := "replay_" + strings.NewReplacer(".", "_", "-", "_", " ", "_", "=", "").Replace(strings.ToLower(e.w.name))
	e.table = s + "." + ident(name)
	view := s + "." + ident(name+"_daemon")
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	for _, q := range []string{
		"select pg_advisory_xact_lock(7734002)",
		"create schema if not exists " + s,
		"create table if not exists " + e.table + " (id bigint primary key, value text not null)",
		"create or replace view " + view + " as select id, value from " + e.table,
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("set up %s: %w", q, err)
		}
	}
	var n int
	if err := tx.QueryRow(ctx, "select count(*) from "+e.table).Scan(&n); err != nil {
		return err
	}
	if n != len(e.w.ids) {
		fmt.Fprintf(e.stderr, "%s: loading %d rows into %s\n", e.c.kind, len(e.w.ids), e.table)
		if _, err := tx.Exec(ctx, "truncate "+e.table); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "insert into "+e.table+" select i, '{\"id\": ' || i || ', \"payload\": \"' || repeat('x', 80) || '\"}' from unnest($1::text[]::bigint[]) i", e.w.ids); err != nil {
			return fmt.Errorf("load rows: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	sleep := ""
	if e.c.cost > 0 {
		sleep = fmt.Sprintf(", (select pg_sleep(%g)) d", e.c.cost.Seconds())
	}
	e.appQ = "select t.id::text, t.value from " + e.table + " t" + sleep + " where t.id = any($1::text[]::bigint[])"
	e.daemonQ = "select t.id::text, t.value from " + view + " t" + sleep + " where t.id = any($1::text[]::bigint[])"
	return nil
}

func (e *replayEnv) pgss(ctx context.Context, relname string) int64 {
	var n int64
	err := e.pool.QueryRow(ctx, `select coalesce(sum(s.calls), 0)::bigint from pg_stat_statements s
join pg_database d on d.oid = s.dbid where d.datname = current_database() and s.query like $1`, "select t.id::text, t.value from "+relname+" t%").Scan(&n)
	if err != nil {
		return -1
	}
	return n
}

// refreshLog is the daemon's Source: it counts queries and records when each id was fetched.
type refreshLog struct {
	src     *postgres.Source
	byID    map[string]int32
	start   time.Time
	queries atomic.Int64
	mu      sync.Mutex
	ids     []int32
	at      []int64 // ns since start
}

// ValidID is the PostgreSQL source's id check (warmer.IDValidator), so that the warmer's doors see it.
func (r *refreshLog) ValidID(id string) error { return r.src.ValidID(id) }

func (r *refreshLog) Fetch(ctx context.Context, ids []string) (map[string][]byte, []string, error) {
	r.queries.Add(1)
	vals, missing, err := r.src.Fetch(ctx, ids)
	if err != nil {
		return vals, missing, err
	}
	now := int64(time.Since(r.start))
	r.mu.Lock()
	for id := range vals {
		r.ids = append(r.ids, r.byID[id])
		r.at = append(r.at, now)
	}
	r.mu.Unlock()
	return vals, missing, nil
}

// replayRecorder marks whether its reader's current Get missed.
type replayRecorder struct {
	lockstep.NopRecorder
	miss bool
}

func (r *replayRecorder) Miss(string) { r.miss = true }

func (e *replayEnv) runMode(ctx context.Context, mode string) (*replayResult, error) {
	c := e.c
	ksName := "kwbench-" + c.kind + "-" + e.run + "-" + mode
	prefix := "kwbench-" + c.kind + ":" + e.run + ":" + mode + ":" // not kwbench:*, which `keepwarm-bench warmup` deletes
	keys, err := lockstep.NewKeys(prefix+"${id}", "", "", "")
	if err != nil {
		return nil, err
	}
	defer func() {
		deletePrefix(e.daemon, prefix)
		e.daemon.Del(context.WithoutCancel(ctx), lockstep.AccessKey(ksName), "keepwarm:decay:"+ksName)
	}()
	appSrc, err := postgres.New(e.pool, postgres.Config{Keyspace: ksName, Query: e.appQ, StatementTimeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	dsrc, err := postgres.New(e.dpool, postgres.Config{Keyspace: ksName, Query: e.daemonQ, StatementTimeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	rl := &refreshLog{src: dsrc, byID: e.byID}
	var appQueries atomic.Int64
	appLoad := benchload.LoaderOf(appSrc)
	load := func(ctx context.Context, id string) ([]byte, error) {
		appQueries.Add(1)
		return appLoad(ctx, id)
	}
	ks := warmer.KeyspaceConfig{Name: ksName, Keys: keys, Src: rl, TTL: c.ttl, Jitter: lockstep.DefaultJitter,
		LockTTL: 5 * time.Second, StatementTimeout: min(2*time.Second, c.ttl/4), PollInterval: time.Second, DecayHalfLife: c.halfLife}
	if mode == "oracle" {
		for _, i := range e.oracle {
			ks.Pinned = append(ks.Pinned, e.w.ids[i])
		}
	} else {
		ks.TopN = c.topK
	}
	wm, err := warmer.New(e.daemon, warmer.Config{Logger: e.log, Keyspaces: []warmer.KeyspaceConfig{ks}})
	if err != nil {
		return nil, err
	}
	readers := make([]*lockstep.Client, c.goroutines)
	recs := make([]*replayRecorder, c.goroutines)
	for g := range readers {
		recs[g] = &replayRecorder{}
		readers[g], err = lockstep.New(e.apps[g%len(e.apps)], ksName, keys, load, c.ttl, lockstep.WithRecorder(recs[g]),
			lockstep.WithAccessRecording(1), lockstep.WithLogger(e.log), lockstep.WithLockTTL(5*time.Second))
		if err != nil {
			return nil, err
		}
	}
	pgssApp0, pgssDaemon0 := e.pgss(ctx, e.table), e.pgss(ctx, strings.TrimSuffix(e.table, `"`)+`_daemon"`)

	dctx, stopDaemon := context.WithCancel(context.WithoutCancel(ctx))
	daemonDone := make(chan struct{})
	rl.start = time.Now()
	go func() {
		defer close(daemonDone)
		_ = wm.Run(dctx)
	}()
	if mode == "oracle" {
		// The oracle knows the workload in advance: let it warm its set before the first read.
		deadline := time.Now().Add(2 * time.Minute)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			st := wm.Status(1)
			if len(st) == 1 && st[0].Refreshes[warmer.ResultOK] >= int64(len(e.oracle)) {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
	}

	n := len(e.w.seq)
	outcome := make([]uint8, n) // 1 hit, 2 miss, 3 error
	issued := make([]int64, n)  // ns since rl.start
	lat := make([]latencies, c.goroutines)
	var next atomic.Int64
	var firstErr error
	var errMu sync.Mutex
	start := time.Now()
	base := start.Sub(rl.start)
	interval := float64(time.Second) / c.rate
	var wg sync.WaitGroup
	for g := range c.goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, rec := readers[g], recs[g]
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if d := time.Until(start.Add(time.Duration(float64(i) * interval))); d > 0 {
					time.Sleep(d)
				}
				rec.miss = false
				t0 := time.Now()
				_, err := cl.Get(context.Background(), e.w.ids[e.w.seq[i]])
				lat[g] = append(lat[g], time.Since(t0))
				issued[i] = int64(t0.Sub(start)) + int64(base)
				switch {
				case err != nil:
					outcome[i] = 3
					errMu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					errMu.Unlock()
				case rec.miss:
					outcome[i] = 2
				default:
					outcome[i] = 1
				}
			}
		}()
	}
	// The hot set's size, sampled every second while the readers run (top_n is a ceiling, not a target).
	sampleDone := make(chan struct{})
	var hotSum, hotN float64
	go func() {
		defer close(sampleDone)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for next.Load() < int64(n) && ctx.Err() == nil {
			<-tick.C
			if st := wm.Status(1); len(st) == 1 {
				hotSum += float64(st[0].Hot)
				hotN++
			}
		}
	}()
	wg.Wait()
	<-sampleDone
	elapsed := time.Since(start)
	endNs := int64(time.Since(rl.start))
	st := wm.Status(1)
	stopDaemon()
	<-daemonDone
	for _, cl := range readers {
		_ = cl.Close(context.Background())
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	res := &replayResult{Mode: mode, Reads: n, Elapsed: elapsed.Seconds(), AppQueries: appQueries.Load(),
		DaemonQueries: rl.queries.Load(), Latency: latencies(slices.Concat(lat...)).summary()}
	if firstErr != nil {
		res.FirstError = firstErr.Error()
	}
	if len(st) == 1 {
		res.HotExpired = st[0].HotExpired
		res.FeedbackJudged, res.FeedbackWasted = st[0].RefreshesJudged, st[0].RefreshesWasted
		res.MeanHot = hotSum / max(hotN, 1)
		res.daemonRefreshes = st[0].Refreshes
	}
	res.PGSSApp = e.pgss(ctx, e.table) - pgssApp0
	res.PGSSDaemon = e.pgss(ctx, strings.TrimSuffix(e.table, `"`)+`_daemon"`) - pgssDaemon0
	bucket := max(1, elapsed.Seconds()/60)
	res.BucketSeconds = bucket
	var bh, bn []int
	for i, o := range outcome {
		switch o {
		case 1:
			res.Hits++
		case 2:
			res.Misses++
		case 3:
			res.Errors++
		}
		b := int(float64(issued[i]-int64(base)) / 1e9 / bucket)
		for len(bh) <= b {
			bh, bn = append(bh, 0), append(bn, 0)
		}
		bn[b]++
		if o == 1 {
			bh[b]++
		}
	}
	for b := range bh {
		res.WarmByBucket = append(res.WarmByBucket, float64(bh[b])/float64(max(bn[b], 1)))
	}
	rl.mu.Lock()
	res.DaemonRows = int64(len(rl.ids))
	res.Judged, res.Wasted = wasted(len(e.w.ids), e.w.seq, issued, rl.ids, rl.at, int64(c.ttl), endNs)
	rl.mu.Unlock()
	return res, nil
}

// readIndex groups read times by id (CSR layout), each id's times sorted.
func readIndex(nids int, seq []int32, at []int64) (off []int32, times []int64) {
	off = make([]int32, nids+1)
	for _, i := range seq {
		off[i+1]++
	}
	for i := range nids {
		off[i+1] += off[i]
	}
	times = make([]int64, len(seq))
	fill := slices.Clone(off[:nids])
	for r, i := range seq {
		times[fill[i]] = at[r]
		fill[i]++
	}
	for i := range nids {
		slices.Sort(times[off[i]:off[i+1]])
	}
	return off, times
}

// wasted counts the refreshes that were never read: refresh j of an id (at r) is wasted when no read of that id
// falls in (r, min(r+ttl, the id's next refresh)]. Refreshes whose window runs past the end are not judged.
func wasted(nids int, seq []int32, readAt []int64, refIDs []int32, refAt []int64, ttl, end int64) (judged, waste int64) {
	off, times := readIndex(nids, seq, readAt)
	roff, rtimes := readIndex(nids, refIDs, refAt)
	for id := range nids {
		reads := times[off[id]:off[id+1]]
		refs := rtimes[roff[id]:roff[id+1]]
		for j, r := range refs {
			until := r + ttl
			if until > end {
				continue
			}
			if j+1 < len(refs) && refs[j+1] < until {
				until = refs[j+1]
			}
			judged++
			k, _ := slices.BinarySearch(reads, r+1)
			if k >= len(reads) || reads[k] > until {
				waste++
			}
		}
	}
	return judged, waste
}

// refreshAll simulates a daemon that refreshes every id from its first read on, every ttl×(1+jitter/2) − ttl/5
// (the default refresh_ahead), with unlimited budget, on the read times of a real run.
func refreshAll(nids int, seq []int32, readAt []int64, ttl time.Duration, end int64) *refreshAllStat {
	off, times := readIndex(nids, seq, readAt)
	period := int64(float64(ttl)*(1+lockstep.DefaultJitter/2)) - int64(ttl/5)
	st := &refreshAllStat{}
	distinct := 0
	for id := range nids {
		reads := times[off[id]:off[id+1]]
		if len(reads) == 0 {
			continue
		}
		distinct++
		for r := reads[0] + period; r+int64(ttl) <= end; r += period {
			st.Refreshes++
			k, _ := slices.BinarySearch(reads, r+1)
			if k >= len(reads) || reads[k] > r+period {
				st.Wasted++
			}
		}
	}
	st.Warm = 1 - float64(distinct)/float64(len(seq))
	return st
}

func printReplay(w io.Writer, rep *replayReport, e *replayEnv) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\treads\treads/s\twarm (hit)\tmiss\terrors\tapp origin queries\tdaemon origin queries\tdaemon refreshes (keys)\twasted refreshes\tpg_stat_statements app+daemon\thot keys expired\tp50\tp99\t")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.2f%%\t%.2f%%\t%d\t%d\t%d\t%d\t%d of %d (%.1f%%)\t%d+%d\t%d\t%s\t%s\t\n", r.Mode, r.Reads,
			float64(r.Reads)/r.Elapsed, 100*r.warm(), 100*float64(r.Misses)/float64(max(r.Reads, 1)), r.Errors,
			r.AppQueries, r.DaemonQueries, r.DaemonRows, r.Wasted, r.Judged, 100*float64(r.Wasted)/float64(max(r.Judged, 1)),
			r.PGSSApp, r.PGSSDaemon, r.HotExpired, benchload.Dur(r.Latency.P50), benchload.Dur(r.Latency.P99))
	}
	if ra := rep.RefreshAll; ra != nil {
		fmt.Fprintf(tw, "refresh-all (simulated)\t%d\t\t%.2f%%\t\t\t\t\t%d\t%d of %d (%.1f%%)\t\t\t\t\t\n", len(e.w.seq), 100*ra.Warm,
			ra.Refreshes, ra.Wasted, ra.Refreshes, 100*float64(ra.Wasted)/float64(max(ra.Refreshes, 1)))
	}
	_ = tw.Flush()
	for _, r := range rep.Results {
		if r.FirstError != "" {
			fmt.Fprintf(w, "%s: first error: %s\n", r.Mode, r.FirstError)
		}
		fmt.Fprintf(w, "%s: the warmer's refreshes by result: %v; its own refresh feedback judged %d, wasted %d (%.1f%%); hot set %.0f keys on average\n",
			r.Mode, r.daemonRefreshes, r.FeedbackJudged, r.FeedbackWasted, 100*float64(r.FeedbackWasted)/float64(max(r.FeedbackJudged, 1)), r.MeanHot)
	}
	var kw, or *replayResult
	for i := range rep.Results {
		switch rep.Results[i].Mode {
		case "keepwarm":
			kw = &rep.Results[i]
		case "oracle":
			or = &rep.Results[i]
		}
	}
	if kw != nil && or != nil {
		ratio := kw.warm() / or.warm()
		fmt.Fprintf(w, "\ntargets: warm fraction keepwarm/oracle = %.2f%% / %.2f%% = %.3f (want >= 0.95) %s", 100*kw.warm(), 100*or.warm(), ratio, mark(ratio >= 0.95))
		fmt.Fprintf(w, "; wasted refreshes keepwarm %d <= oracle %d %s", kw.Wasted, or.Wasted, mark(kw.Wasted <= or.Wasted))
		if ra := rep.RefreshAll; ra != nil {
			fmt.Fprintf(w, "; wasted refreshes keepwarm %d < refresh-all %d %s", kw.Wasted, ra.Wasted, mark(kw.Wasted < ra.Wasted))
		}
		fmt.Fprintln(w)
	}
}

func replaySVG(rep *replayReport) []byte {
	var series []svgSeries
	xmax := 0.0
	for i, r := range rep.Results {
		s := svgSeries{name: fmt.Sprintf("%s (%.1f%% warm overall)", r.Mode, 100*r.warm()), color: palette[i%len(palette)], dashed: r.Mode == "oracle"}
		for b, f := range r.WarmByBucket {
			x := (float64(b) + 0.5) * r.BucketSeconds
			s.pts = append(s.pts, [2]float64{x, 100 * f})
			xmax = max(xmax, x)
		}
		series = append(series, s)
	}
	title := fmt.Sprintf("%s: warm (hit) fraction over the replay, K = %d, TTL %v, %.0f reads/s planned", rep.Workload[:strings.IndexByte(rep.Workload+":", ':')], rep.TopK, rep.TTL, rep.Rate)
	return lineSVG(title, "seconds into the replay", "reads that hit (%)", 0, xmax, 0, 100, series)
}
