package warmer_test

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/warmer"
)

func idRange(from, to int) []string {
	out := make([]string, 0, to-from+1)
	for i := from; i <= to; i++ {
		out = append(out, strconv.Itoa(i))
	}
	return out
}

func newWarmer(t *testing.T, f *fixture, cfg warmer.KeyspaceConfig) *warmer.Warmer {
	t.Helper()
	w, err := warmer.New(f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestWarmupSpreadIsUniform warms 2,000 keys with --spread and checks, with Pearson's chi-square test over 10
// equal bins (9 degrees of freedom), that the written TTLs are uniform over [ttl, ttl+spread): the statistic
// must stay below 27.88, the 0.999 quantile, so a correct implementation fails this test once in 1,000 runs.
func TestWarmupSpreadIsUniform(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2000)
	cfg := f.config()
	cfg.TTL = time.Minute
	cfg.RefreshAhead = 10 * time.Second
	cfg.BatchSize = 500
	cfg.KeepMeta = true // the check below reads each write's time from the meta hash (written_ms)
	spread := 20 * time.Second
	w := newWarmer(t, f, cfg)
	ctx := context.Background()
	res, err := w.Warmup(ctx, "items", warmer.SliceIDs(idRange(1, 2000)), warmer.WarmupOptions{Spread: spread})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requested != 2000 || res.Written != 2000 || res.Failed != 0 || res.Batches != 4 {
		t.Fatalf("result = %+v, want 2000 requested and written in 4 batches", res)
	}
	// Read back what Redis holds: written TTL = PTTL + time since the write (meta written_ms, Redis clock).
	pipe := f.rdb.Pipeline()
	now := pipe.Time(ctx)
	type q struct {
		w    interface{ Val() string }
		pttl interface{ Val() time.Duration }
	}
	var qs []q
	for _, id := range idRange(1, 2000) {
		ks, _ := f.keys.For(id)
		qs = append(qs, q{pipe.HGet(ctx, ks.Meta, lockstep.MetaWrittenField), pipe.PTTL(ctx, ks.Cache)})
	}
	after := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	// Each PTTL was read between the two TIMEs, so using the first underestimates a written TTL by at most the
	// pipeline's own duration (which a busy machine stretches): that much more slack below.
	slack := 50*time.Millisecond + after.Val().Sub(now.Val())
	const bins = 10
	var counts [bins]int
	for _, x := range qs {
		wms, err := strconv.ParseInt(x.w.Val(), 10, 64)
		if err != nil {
			t.Fatalf("meta written_ms %q: %v", x.w.Val(), err)
		}
		written := x.pttl.Val() + time.Duration(now.Val().UnixMilli()-wms)*time.Millisecond
		if written < cfg.TTL-slack || written > cfg.TTL+spread+50*time.Millisecond {
			t.Fatalf("written TTL %v outside [%v, %v]", written, cfg.TTL, cfg.TTL+spread)
		}
		b := int(float64(bins) * float64(written-cfg.TTL) / float64(spread))
		counts[min(max(b, 0), bins-1)]++
	}
	expected := 2000.0 / bins
	chi2 := 0.0
	for _, c := range counts {
		chi2 += math.Pow(float64(c)-expected, 2) / expected
	}
	t.Logf("TTL bins %v, chi-square %.2f (df 9, critical 27.88 at p=0.001)", counts, chi2)
	if chi2 > 27.88 {
		t.Errorf("chi-square %.2f > 27.88: written TTLs are not uniform over the spread window: %v", chi2, counts)
	}
	var total int64
	for _, c := range res.TTLs.Counts {
		total += c
	}
	if total != 2000 || res.TTLs.Min != cfg.TTL || res.TTLs.Max != cfg.TTL+spread {
		t.Errorf("result histogram: %d values over [%v, %v), want 2000 over [%v, %v)", total, res.TTLs.Min, res.TTLs.Max, cfg.TTL, cfg.TTL+spread)
	}
}

func TestWarmupSkipsLockedAndCountsMissing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10)
	ctx := context.Background()
	ks, _ := f.keys.For("3")
	f.rdb.SetNX(ctx, ks.Lock, "app-token", time.Minute)
	w := newWarmer(t, f, f.config())
	res, err := w.Warmup(ctx, "items", warmer.SliceIDs([]string{"1", "2", "3", "404", "2"}), warmer.WarmupOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requested != 5 || res.Written != 2 || res.SkippedLocked != 1 || res.Missing != 1 || res.Failed != 0 {
		t.Errorf("result = requested %d written %d locked %d missing %d failed %d; want 5 2 1 1 0",
			res.Requested, res.Written, res.SkippedLocked, res.Missing, res.Failed)
	}
	if n := f.src.count("3"); n != 0 {
		t.Errorf("origin queried %d times for id 3, whose lock an app holds", n)
	}
	if v, _ := f.rdb.Get(ctx, ks.Lock).Result(); v != "app-token" {
		t.Errorf("the app's lock = %q", v)
	}
}

func TestWarmupDryRunQueriesAndWritesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100)
	w := newWarmer(t, f, f.config())
	ctx := context.Background()
	res, err := w.Warmup(ctx, "items", warmer.SliceIDs(idRange(1, 100)), warmer.WarmupOptions{DryRun: true, Spread: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requested != 100 || res.Batches != 2 || res.Written != 0 {
		t.Errorf("dry run = %+v, want 100 requested in 2 batches, none written", res)
	}
	var projected int64
	for _, c := range res.TTLs.Counts {
		projected += c
	}
	if projected != 100 {
		t.Errorf("projected histogram holds %d TTLs, want 100", projected)
	}
	f.src.mu.Lock()
	queries := f.src.queries
	f.src.mu.Unlock()
	if queries != 0 {
		t.Errorf("dry run made %d origin queries", queries)
	}
	if keys := f.rdb.Keys(ctx, "*"+f.prefix+"*").Val(); len(keys) != 0 {
		t.Errorf("dry run wrote %d keys, e.g. %q", len(keys), keys[0])
	}
}

func TestWarmupInterruptedLeavesNoLocks(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 400)
	started := make(chan struct{}, 1)
	f.src.src = f.source(t, "select id, body from "+f.table+", pg_sleep(0.3) where id = any($1)")
	f.src.before = func([]string) {
		select {
		case started <- struct{}{}:
		default:
		}
	}
	cfg := f.config()
	cfg.BatchSize = 50
	w := newWarmer(t, f, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan warmer.WarmupResult, 1)
	go func() {
		res, err := w.Warmup(ctx, "items", warmer.SliceIDs(idRange(1, 400)), warmer.WarmupOptions{})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	<-started // the batch holds its locks while its query runs
	if locks := f.rdb.Keys(context.Background(), "lock:"+f.prefix+"*").Val(); len(locks) == 0 {
		t.Fatal("no lock held mid-warmup: the test tests nothing")
	}
	cancel()
	res := <-done
	if !res.Interrupted {
		t.Error("result not marked interrupted")
	}
	if res.Written >= 400 {
		t.Errorf("written %d of 400: the interruption came too late to test anything", res.Written)
	}
	if locks := f.rdb.Keys(context.Background(), "lock:"+f.prefix+"*").Val(); len(locks) != 0 {
		t.Errorf("locks left after an interrupted warmup: %v", locks)
	}
	t.Logf("interrupted: %+v", fmt.Sprintf("requested %d written %d failed %d", res.Requested, res.Written, res.Failed))
}

func TestWarmupRateNeverRaisesBudget(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 40)
	cfg := f.config()
	cfg.BatchSize = 10
	cfg.OriginRate = 1000
	w := newWarmer(t, f, cfg)
	// 40 ids at 20 ids/s with a burst of one batch: at least (40-10)/20 = 1.5 s.
	start := time.Now()
	res, err := w.Warmup(context.Background(), "items", warmer.SliceIDs(idRange(1, 40)), warmer.WarmupOptions{Rate: 20})
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 1400*time.Millisecond {
		t.Errorf("40 ids at --rate 20 took %v, want >= 1.5 s", el)
	}
	if res.Written != 40 {
		t.Errorf("written %d, want 40", res.Written)
	}
	if _, err := w.Warmup(context.Background(), "nope", warmer.SliceIDs(nil), warmer.WarmupOptions{}); err == nil {
		t.Error("unknown keyspace: no error")
	}
}

// Under maxmemory with allkeys-lru, a warmup larger than the memory left evicts its own earlier values while it
// writes later ones. A value gone when the warmup returns was not kept, whenever it was evicted: the result's
// Written must equal what an outside reader finds right after it returns (before, only values evicted within
// their own batch were reported, and Written overstated what a promotion would find cached).
func TestWarmupReportsValuesEvictedBeforeItReturns(t *testing.T) {
	t.Parallel()
	const n = 400
	f := newFixture(t, n)
	ctx := context.Background()
	if _, err := f.pool.Exec(ctx, "update "+f.table+" set body = jsonb_build_object('id', id, 'pad', repeat('x', 4000))"); err != nil {
		t.Fatal(err)
	}
	priv := testenv.PrivateRedis(t)
	used := memoryUsed(t, priv)
	setConfig(t, priv, "maxmemory-policy", "allkeys-lru")
	setConfig(t, priv, "maxmemory", strconv.FormatInt(used+512<<10, 10)) // room for about 100 of the 400 values
	cfg := f.config()
	cfg.TTL = time.Hour
	w, err := warmer.New(priv, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	keys := make([]string, n)
	for i := range ids {
		ids[i] = strconv.Itoa(i + 1)
		keys[i] = f.key(ids[i])
	}
	// Reads evict too, while Redis is over maxmemory (every command runs the eviction first): the values evicted
	// after the last batch, by the warmup's own final check or by this test's reads, are those that the
	// evicted_keys counter gains after the last batch's progress report.
	evicted := func() int64 {
		info := priv.Info(ctx, "stats").Val()
		i := strings.Index(info, "evicted_keys:")
		if i < 0 {
			t.Fatalf("INFO stats has no evicted_keys: %q", info)
		}
		v, err := strconv.ParseInt(strings.TrimSpace(strings.SplitN(info[i+len("evicted_keys:"):], "\n", 2)[0]), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	var afterLastBatch int64
	res, err := w.Warmup(ctx, "items", warmer.SliceIDs(ids), warmer.WarmupOptions{
		Progress: func(warmer.WarmupResult) { afterLastBatch = evicted() }, // never called concurrently
	})
	if err != nil {
		t.Fatal(err)
	}
	present := priv.Exists(ctx, keys...).Val()
	late := evicted() - afterLastBatch
	t.Logf("written %d, not kept %d, failed %d; present after return: %d; evicted after the last batch: %d",
		res.Written, res.NotKept, res.Failed, present, late)
	if res.NotKept == 0 {
		t.Fatalf("no value reported not kept: the test did not exhaust memory (present %d of %d)", present, n)
	}
	if res.Written < present || res.Written > present+late {
		t.Errorf("warmup reports %d written; an outside reader finds %d present, and at most %d were evicted after the last batch",
			res.Written, present, late)
	}
	if got := res.Written + res.SkippedLocked + res.Missing + res.Failed; got != res.Requested {
		t.Errorf("written+locked+missing+failed = %d, want requested %d", got, res.Requested)
	}
}
