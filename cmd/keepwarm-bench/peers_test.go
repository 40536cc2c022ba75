package main

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/warmer"
)

// TestParsePeers: defaults, --quick and its explicit overrides, and every bad input a usage error naming the flag.
func TestParsePeers(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		args    []string
		wantErr string // "" means it parses
		check   func(t *testing.T, c peersConfig)
	}{
		{name: "defaults", check: func(t *testing.T, c peersConfig) {
			if got, want := c.instances, []int{1, 4, 16}; !slices.Equal(got, want) {
				t.Errorf("instances: got %v, want %v", got, want)
			}
			if got, want := len(c.strategies), len(peerStrategies); got != want {
				t.Errorf("strategies: got %d, want all %d", got, want)
			}
			if c.rounds != 3 || c.orderSeed == 0 {
				t.Errorf("rounds %d, order seed %d: want 3 and a seed picked from the clock", c.rounds, c.orderSeed)
			}
			if c.ttl != 10*time.Second || c.jitter != 0.1 || c.skew != 1.1 || c.duration != 2*time.Minute {
				t.Errorf("ttl %v jitter %g skew %g duration %v: want 10s, 0.1, 1.1, 2m", c.ttl, c.jitter, c.skew, c.duration)
			}
		}},
		{name: "rounds and order seed", args: []string{"--rounds", "5", "--order-seed", "42"}, check: func(t *testing.T, c peersConfig) {
			if c.rounds != 5 || c.orderSeed != 42 {
				t.Errorf("rounds %d, order seed %d: want 5, 42", c.rounds, c.orderSeed)
			}
		}},
		{name: "rounds zero", args: []string{"--rounds", "0"}, wantErr: "--rounds must be >= 1"},
		{name: "quick", args: []string{"--quick"}, check: func(t *testing.T, c peersConfig) {
			if c.duration != 30*time.Second || c.warmup != 10*time.Second {
				t.Errorf("duration %v warmup %v: want 30s and 10s", c.duration, c.warmup)
			}
		}},
		{name: "quick, explicit duration wins", args: []string{"--quick", "--duration", "7s"}, check: func(t *testing.T, c peersConfig) {
			if c.duration != 7*time.Second || c.warmup != 10*time.Second {
				t.Errorf("duration %v warmup %v: want 7s and 10s", c.duration, c.warmup)
			}
		}},
		{name: "strategies in the order given", args: []string{"--strategies", "keepwarm, sturdyc", "--instances", "16,2"}, check: func(t *testing.T, c peersConfig) {
			var names []string
			for _, st := range c.strategies {
				names = append(names, st.name)
			}
			if want := []string{"keepwarm", "sturdyc"}; !slices.Equal(names, want) {
				t.Errorf("strategies: got %v, want %v", names, want)
			}
			if want := []int{16, 2}; !slices.Equal(c.instances, want) {
				t.Errorf("instances: got %v, want %v", c.instances, want)
			}
		}},
		{name: "unknown strategy", args: []string{"--strategies", "sturdyc,ristretto"}, wantErr: `unknown strategy "ristretto"`},
		{name: "strategy twice", args: []string{"--strategies", "redsync,redsync"}, wantErr: `"redsync" listed twice`},
		{name: "instances zero", args: []string{"--instances", "0"}, wantErr: `--instances: "0"`},
		{name: "instances not a number", args: []string{"--instances", "1,four"}, wantErr: `--instances: "four"`},
		{name: "instances twice", args: []string{"--instances", "4,4"}, wantErr: "--instances: 4 listed twice"},
		{name: "more instances than workers", args: []string{"--instances", "16", "--workers", "8"}, wantErr: "more instances than --workers"},
		{name: "skew 1", args: []string{"--skew", "1"}, wantErr: "--skew must be > 1"},
		{name: "ttl too short", args: []string{"--ttl", "500ms"}, wantErr: "--ttl must be >= 1s"},
		{name: "jitter above 1", args: []string{"--jitter", "1.5"}, wantErr: "--jitter must be in [0, 1]"},
		{name: "hot above keys", args: []string{"--keys", "10", "--hot", "11"}, wantErr: "--hot must be in [1, --keys]"},
		{name: "rate zero", args: []string{"--rate", "0"}, wantErr: "--rate must be > 0"},
		{name: "refresh-ahead past half the TTL", args: []string{"--refresh-ahead", "5s"}, wantErr: "--refresh-ahead must be in (0, ttl/2)"},
		{name: "several problems at once", args: []string{"--rate", "-1", "--pg-conns", "0"}, wantErr: "--rate must be > 0; --pg-conns must be >= 1"},
		{name: "not a duration", args: []string{"--duration", "5x"}, wantErr: `invalid value "5x"`},
		{name: "stray argument", args: []string{"extra"}, wantErr: "unexpected arguments"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := parsePeers(tt.args, new(testWriter))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("parse %q: %v", tt.args, err)
				}
				tt.check(t, c)
				return
			}
			var u usageError
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("parse %q: got error %v, want one containing %q", tt.args, err, tt.wantErr)
			}
			if !asUsage(err, &u) {
				t.Errorf("parse %q: got %T, want a usageError (exit code 2)", tt.args, err)
			}
		})
	}
}

func asUsage(err error, u *usageError) bool {
	v, ok := err.(usageError)
	if ok {
		*u = v
	}
	return ok
}

// TestPeerTable: every peer strategy has a unique name, a library, a configuration text and a start, and its
// view name is a plain identifier.
func TestPeerTable(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	c, err := parsePeers(nil, new(testWriter))
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range peerStrategies {
		if st.name == "" || st.library == "" || st.config == nil || st.start == nil || st.config(c) == "" {
			t.Errorf("strategy %q: want a name, a library, a configuration and a start", st.name)
		}
		if seen[st.name] {
			t.Errorf("strategy %q listed twice", st.name)
		}
		seen[st.name] = true
		if v := peerView(st.name, true); strings.Trim(v, "abcdefghijklmnopqrstuvwxyz_") != "" {
			t.Errorf("view %q: want lower-case letters and underscores only", v)
		}
	}
}

func TestFetchedAt(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in     string
		want   int64
		wantOK bool
	}{
		{`1764650000123456 {"id": 1}`, 1764650000123456, true},
		{`{"id": 1}`, 0, false},
		{` {"id": 1}`, 0, false},
		{`12x4 {}`, 0, false},
		{``, 0, false},
	} {
		got, ok := fetchedAt([]byte(tt.in))
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("fetchedAt(%q): got %d, %v; want %d, %v", tt.in, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestZipfShare(t *testing.T) {
	t.Parallel()
	if got := zipfShare(1.1, 100, 100); math.Abs(got-1) > 1e-12 {
		t.Errorf("every id hot: got share %g, want 1", got)
	}
	// Ranks 1 and 2 of 2 with s = 2: 1 / (1 + 1/4) = 0.8.
	if got := zipfShare(2, 2, 1); math.Abs(got-0.8) > 1e-12 {
		t.Errorf("zipfShare(2, 2, 1): got %g, want 0.8", got)
	}
	if a, b := zipfShare(1.1, 10000, 100), zipfShare(1.1, 10000, 200); !(a < b && b < 1) {
		t.Errorf("share of the top 100, 200 of 10000: got %g, %g; want increasing and below 1", a, b)
	}
}

// TestFirstGetHook: the hook records whether a read's first GET found a value, alone or in a pipeline, and only
// the first: a later GET of the same read changes nothing.
func TestFirstGetHook(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	rdb.AddHook(firstGetHook{})
	ctx := context.Background()
	if err := rdb.Set(ctx, prefix+"there", "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		read func(ctx context.Context)
		want int32
	}{
		{"GET of a missing key", func(ctx context.Context) { rdb.Get(ctx, prefix+"absent") }, firstGetMissing},
		{"GET of a present key", func(ctx context.Context) { rdb.Get(ctx, prefix+"there") }, firstGetFound},
		{"pipeline PTTL then GET, present", func(ctx context.Context) {
			_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				p.PTTL(ctx, prefix+"there")
				p.Get(ctx, prefix+"there")
				return nil
			})
		}, firstGetFound},
		{"pipeline GET, missing", func(ctx context.Context) {
			_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error { p.Get(ctx, prefix+"absent"); return nil })
		}, firstGetMissing},
		{"missing, then present: the first counts", func(ctx context.Context) {
			rdb.Get(ctx, prefix+"absent")
			rdb.Get(ctx, prefix+"there")
		}, firstGetMissing},
		{"no GET at all", func(ctx context.Context) { rdb.PTTL(ctx, prefix+"there") }, firstGetNone},
		{"MGET of a present key (sturdyc's batch read)", func(ctx context.Context) { rdb.MGet(ctx, prefix+"there") }, firstGetFound},
		{"MGET with a missing key", func(ctx context.Context) { rdb.MGet(ctx, prefix+"there", prefix+"absent") }, firstGetMissing},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rctx, rs := withReadState(ctx)
			tt.read(rctx)
			if got := rs.first.Load(); got != tt.want {
				t.Errorf("state: got %d, want %d", got, tt.want)
			}
		})
	}
}

// TestPeersRuns runs the peers scenario for a few seconds with N = 1 and 2, every strategy, on a private
// redis-server and the shared PostgreSQL (its own schema), and checks that every cell read, that its counters are
// consistent with one another, and that the wrapper's origin count equals pg_stat_statements' over the cell.
func TestPeersRuns(t *testing.T) {
	testenv.Redis(t) // the shared services must be up; this test's Redis is a private redis-server
	schema := testenv.Schema(t, testenv.Postgres(t))
	var stdout, stderr bytes.Buffer
	c, err := parsePeers([]string{"--instances", "1,2", "--duration", "2s", "--warmup", "1s", "--rate", "400",
		"--workers", "8", "--keys", "300", "--hot", "10", "--cost", "1ms", "--rounds", "1", "--schema", schema,
		"--postgres", testenv.PostgresURL()}, &stderr)
	if err != nil {
		t.Fatalf("parse flags: %v", err)
	}
	rep, err := peers(context.Background(), c, &stdout, &stderr)
	t.Logf("\n%s", stdout.String())
	if err != nil {
		t.Fatalf("peers: %v\n%s", err, stderr.String())
	}
	if got, want := len(rep.Results), len(peerStrategies)*2; got != want {
		t.Fatalf("got %d cells, want %d (every strategy × N = 1, 2)", got, want)
	}
	if len(rep.Configs) != len(peerStrategies) {
		t.Errorf("got %d configurations printed, want %d", len(rep.Configs), len(peerStrategies))
	}
	for _, r := range rep.Results {
		t.Run(r.Strategy+"/"+strings.Repeat("N", r.Instances), func(t *testing.T) {
			if r.Reads == 0 || r.Latency.N == 0 || r.Baseline.N == 0 {
				t.Fatalf("reads %d, latency samples %d, baseline samples %d: want all > 0", r.Reads, r.Latency.N, r.Baseline.N)
			}
			if r.Errors != 0 {
				t.Errorf("errors: got %d (first: %s), want 0", r.Errors, r.FirstError)
			}
			// Each cell starts from an empty cache: its first reads cannot all be hits. (The 1 s warm-up over 300
			// ids at 400 reads/s leaves many ids unread.)
			if r.Misses < 1 || r.Misses > r.Reads || r.HotMisses > r.Misses || r.HotReads > r.Reads || r.HotMisses > r.HotReads {
				t.Errorf("misses %d, hot misses %d, hot reads %d, reads %d: want 1 <= misses <= reads, hot misses <= misses and <= hot reads <= reads",
					r.Misses, r.HotMisses, r.HotReads, r.Reads)
			}
			if r.OriginQueries < 1 || r.OriginFetches < r.OriginQueries || r.OriginHotFetches > r.OriginFetches || r.DaemonQueries > r.OriginQueries {
				t.Errorf("origin queries %d, fetches %d, hot fetches %d, daemon queries %d: want 1 <= queries <= fetches, hot <= fetches, daemon <= queries",
					r.OriginQueries, r.OriginFetches, r.OriginHotFetches, r.DaemonQueries)
			}
			if r.CellPGSS < 0 {
				t.Fatalf("pg_stat_statements is not available in the test database")
			}
			if r.CellQueries != r.CellPGSS {
				t.Errorf("origin queries over the cell: the wrapper counted %d, pg_stat_statements %d; want equal", r.CellQueries, r.CellPGSS)
			}
			if r.RedisCommands < 1 || r.CommandsPerRead <= 0 {
				t.Errorf("Redis commands %d (%.2f per read): want some (every strategy writes what it fetched to Redis)", r.RedisCommands, r.CommandsPerRead)
			}
			if r.Age.N != r.Latency.N || r.Age.Max <= 0 {
				t.Errorf("value ages: %d samples for %d reads, max %v; want one per read, positive", r.Age.N, r.Latency.N, r.Age.Max)
			}
			if strings.Contains(r.Strategy, "keepwarm") != (r.Daemon != nil) {
				t.Errorf("daemon refreshes %v: want them for the rows with the keepwarm daemon only", r.Daemon)
			}
		})
	}
}

// TestReadWaited: a read waited for the origin when its value was produced after it began, whatever its first GET
// saw; a value produced before it began is a hit even when its first GET found nothing (a lock wait for a value
// another reader wrote earlier cannot produce one, but the rule does not depend on it).
func TestReadWaited(t *testing.T) {
	t.Parallel()
	began := time.UnixMicro(1_764_650_000_000_000)
	for _, tt := range []struct {
		name       string
		producedUS int64
		first      int32
		wantWaited bool
		wantFound  bool
	}{
		{"produced before, found by GET", began.UnixMicro() - 1, firstGetFound, false, false},
		{"produced before, no GET (process memory)", began.UnixMicro() - 5_000_000, firstGetNone, false, false},
		{"produced at the start", began.UnixMicro(), firstGetMissing, false, false},
		{"produced after, GET missed", began.UnixMicro() + 5_000, firstGetMissing, true, false},
		{"produced after, no GET (coalesced in memory)", began.UnixMicro() + 5_000, firstGetNone, true, false},
		// sturdyc's distributed-storage path: the first GET found a record older than refreshAfter and the read
		// waited for its synchronous rebuild. The rule before issue 35 did not count it.
		{"produced after, GET found a value then rebuilt", began.UnixMicro() + 5_000, firstGetFound, true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			waited, found := readWaited(tt.producedUS, began, tt.first)
			if waited != tt.wantWaited || found != tt.wantFound {
				t.Errorf("readWaited: got waited %v, found %v; want %v, %v", waited, found, tt.wantWaited, tt.wantFound)
			}
		})
	}
}

// TestOriginCostPerID: an origin query for n ids sleeps n × --cost, and the counting wrapper sums the time spent
// in window queries (origin time), the daemon's apart.
func TestOriginCostPerID(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	const cost = 20 * time.Millisecond
	e := &peersEnv{c: peersConfig{services: services{schema: schema}, keys: 20, cost: cost, lockTTL: 5 * time.Second}, pool: pool}
	ctx := context.Background()
	if err := e.setupDB(ctx); err != nil {
		t.Fatal(err)
	}
	o := newOriginCounter(1)
	now := time.Now()
	o.setWindow(now.Add(-time.Minute), now.Add(time.Minute))
	app, err := e.source(pool, o, "lockstep", false)
	if err != nil {
		t.Fatal(err)
	}
	daemon, err := e.source(pool, o, "keepwarm", true)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		src  countedSource
		ids  []string
	}{
		{"app, one id", app, []string{"3"}},
		{"daemon, a batch of 8", daemon, []string{"1", "2", "3", "4", "5", "6", "7", "8"}},
	} {
		t0 := time.Now()
		vals, missing, err := tt.src.Fetch(ctx, tt.ids)
		took := time.Since(t0)
		if err != nil || len(vals) != len(tt.ids) || len(missing) != 0 {
			t.Fatalf("%s: got %d values, missing %v, error %v; want %d values", tt.name, len(vals), missing, err, len(tt.ids))
		}
		// The upper bound is loose: a shared machine can delay a query by far more than its sleep.
		if want := time.Duration(len(tt.ids)) * cost; took < want || took > want+time.Second {
			t.Errorf("%s: took %v, want about %v (%d ids × %v)", tt.name, took, want, len(tt.ids), cost)
		}
	}
	all, d := time.Duration(o.nanos.Load()), time.Duration(o.dNanos.Load())
	if all < 9*cost || d < 8*cost || d >= all {
		t.Errorf("origin time: got %v, daemon's %v; want at least 9 × %v, the daemon's at least 8 × and less than all", all, d, cost)
	}
}

// TestRoundOrder: the same seed and round give the same order, every order is a permutation of the strategies, and
// over a few rounds the order changes, so no strategy always runs first or last.
func TestRoundOrder(t *testing.T) {
	t.Parallel()
	names := func(sts []peerStrategy) []string {
		var out []string
		for _, st := range sts {
			out = append(out, st.name)
		}
		return out
	}
	all := names(peerStrategies)
	firsts, lasts := map[string]bool{}, map[string]bool{}
	for round := 1; round <= 8; round++ {
		a, b := names(roundOrder(peerStrategies, 7, round)), names(roundOrder(peerStrategies, 7, round))
		if !slices.Equal(a, b) {
			t.Errorf("round %d, seed 7: got %v, then %v; want the same order twice", round, a, b)
		}
		if got := slices.Sorted(slices.Values(a)); !slices.Equal(got, slices.Sorted(slices.Values(all))) {
			t.Errorf("round %d: got %v, want a permutation of %v", round, a, all)
		}
		firsts[a[0]], lasts[a[len(a)-1]] = true, true
	}
	if len(firsts) < 2 || len(lasts) < 2 {
		t.Errorf("over 8 rounds: first strategies %v, last %v; want the order to change", firsts, lasts)
	}
	if a, b := names(roundOrder(peerStrategies, 7, 1)), names(roundOrder(peerStrategies, 8, 1)); slices.Equal(a, b) && slices.Equal(names(roundOrder(peerStrategies, 7, 2)), names(roundOrder(peerStrategies, 8, 2))) {
		t.Errorf("seeds 7 and 8 gave the same orders %v: want the seed to matter", a)
	}
	if got := names(peerStrategies); !slices.Equal(got, all) {
		t.Errorf("roundOrder changed its argument: %v", got)
	}
}

// TestSpreadOf: the median (the middle value, or the mean of the two middle ones) and the range, whatever the
// input order; the format shows the range only for several rounds.
func TestSpreadOf(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		xs   []float64
		want spread
	}{
		{"none", nil, spread{}},
		{"one", []float64{4}, spread{4, 4, 4}},
		{"three, unsorted", []float64{9, 1, 5}, spread{5, 1, 9}},
		{"four: mean of the middle two", []float64{10, 1, 4, 2}, spread{3, 1, 10}},
		{"an outlier moves the range, not the median", []float64{1, 1.2, 1.1, 40, 1.05}, spread{1.1, 1, 40}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := spreadOf(tt.xs); got != tt.want {
				t.Errorf("spreadOf(%v): got %+v, want %+v", tt.xs, got, tt.want)
			}
		})
	}
	if got, want := (spread{3, 1, 10}).format("%.1f", 3), "3.0 [1.0–10.0]"; got != want {
		t.Errorf("format, 3 rounds: got %q, want %q", got, want)
	}
	if got, want := (spread{3, 3, 3}).format("%.1f", 1), "3.0"; got != want {
		t.Errorf("format, 1 round: got %q, want %q", got, want)
	}
}

// TestSummarizePeers: cells are grouped by strategy and N over the rounds, in the configurations' order.
func TestSummarizePeers(t *testing.T) {
	t.Parallel()
	rep := &peersReport{Configs: []peerConfig{{Strategy: "b"}, {Strategy: "a"}}}
	for round, hot := range []int64{4, 0, 2} {
		rep.Results = append(rep.Results,
			peersResult{Strategy: "a", Instances: 4, Round: round + 1, HotReads: 1000, HotMisses: hot, Reads: 2000, Misses: 2 * hot},
			peersResult{Strategy: "b", Instances: 4, Round: round + 1, HotReads: 1000, Reads: 2000, OriginTime: time.Duration(round+1) * time.Second})
	}
	got := summarizePeers(rep)
	if len(got) != 2 || got[0].Strategy != "b" || got[1].Strategy != "a" || got[0].Rounds != 3 {
		t.Fatalf("got %+v, want b then a, 3 rounds each", got)
	}
	if want := (spread{0.2, 0, 0.4}); got[1].HotWaitPct != want {
		t.Errorf("a's hot waits %%: got %+v, want %+v", got[1].HotWaitPct, want)
	}
	if want := (spread{2, 1, 3}); got[0].OriginSeconds != want {
		t.Errorf("b's origin seconds: got %+v, want %+v", got[0].OriginSeconds, want)
	}
}

// TestDaemonTOML: the daemon's config file loads as `keepwarm run` loads it; the keepwarm-defaults row keeps the
// shipped refresh_ahead and top_n, the tuned rows take --refresh-ahead and --top-n (the shipped top_n when 0),
// and top_n never follows --hot.
func TestDaemonTOML(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name      string
		args      []string
		tuned     bool
		wantLead  time.Duration
		wantTopN  int
		wantConns int
		wantBatch int
		wantStmt  time.Duration
	}{
		{"shipped defaults", []string{"--hot", "300"}, false, time.Duration(warmer.DefaultRefreshAheadFraction * float64(10*time.Second)), warmer.DefaultTopN, 4, warmer.DefaultBatchSize, time.Second},
		{"tuned, top_n unset", []string{"--hot", "300"}, true, 500 * time.Millisecond, warmer.DefaultTopN, 4, 40, 400 * time.Millisecond},
		{"tuned, top_n set", []string{"--hot", "300", "--top-n", "50", "--refresh-ahead", "1s", "--pg-conns", "2", "--batch-size", "10"}, true, time.Second, 50, 2, 10, 300 * time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parsePeers(tt.args, new(testWriter))
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "keepwarm.toml")
			toml := daemonTOML(c, tt.tuned, "ks", "p:v:${id}", "redis://127.0.0.1:1/0", "postgres://u@127.0.0.1:1/db", "select id, value from t where id = any($1::text[])", "auto")
			if err := os.WriteFile(path, []byte(toml), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := config.LoadEnv(path, nil)
			if err != nil {
				t.Fatalf("load:\n%s\n%v", toml, err)
			}
			ks := cfg.Keyspace("ks")
			if ks.RefreshAhead != tt.wantLead || ks.TopN != tt.wantTopN {
				t.Errorf("refresh_ahead %v, top_n %d; want %v, %d\n%s", ks.RefreshAhead, ks.TopN, tt.wantLead, tt.wantTopN, toml)
			}
			if ks.BatchSize != tt.wantBatch || cfg.Postgres.StatementTimeout != tt.wantStmt {
				t.Errorf("batch_size %d, statement_timeout %v; want %d, %v (2 × the batch's sleep at 5ms per id, at least 300ms)",
					ks.BatchSize, cfg.Postgres.StatementTimeout, tt.wantBatch, tt.wantStmt)
			}
			if got := cfg.Postgres.MaxConns; int(got) != tt.wantConns {
				t.Errorf("the daemon's max_conns: got %d, want %d (--pg-conns)", got, tt.wantConns)
			}
		})
	}
}

// TestHotFetchRateIgnoresTheWindowPhase: an id refreshed every 9.4s has the rate 10/9.4 per 10s TTL whether a
// 30s window caught 3 or 4 of its fetches; fewer than 2 fetches give no rate.
func TestHotFetchRateIgnoresTheWindowPhase(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	at := func(offsets ...float64) hotFetches {
		var h hotFetches
		for _, o := range offsets {
			ts := t0.Add(time.Duration(o * float64(time.Second)))
			if h.n == 0 || ts.Before(h.first) {
				h.first = ts
			}
			if ts.After(h.last) {
				h.last = ts
			}
			h.n++
		}
		return h
	}
	want := 10 / 9.4
	for name, h := range map[string]hotFetches{
		"3 in the window": at(5, 14.4, 23.8),
		"4 in the window": at(0.5, 9.9, 19.3, 28.7),
	} {
		got, ok := h.perTTL(10 * time.Second)
		if !ok || math.Abs(got-want) > 1e-9 {
			t.Errorf("%s: perTTL = %v, %v; want %v, true", name, got, ok, want)
		}
	}
	if _, ok := at(3).perTTL(10 * time.Second); ok {
		t.Errorf("one fetch: perTTL ok, want no rate")
	}
}
