package warmer_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/sources/postgres"
	"github.com/keepwarm/keepwarm/warmer"
)

// The fault tests: every fault ends with no orphaned lock and every outcome counted under its own name.

// lockKeys lists the lock keys under the fixture's prefix on rdb.
func (f *fixture) lockKeys(t *testing.T, rdb redis.UniversalClient) []string {
	t.Helper()
	keys, err := rdb.Keys(context.Background(), "lock:"+f.prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func (f *fixture) keySet(t *testing.T, id string) lockstep.KeySet {
	t.Helper()
	ks, err := f.keys.For(id)
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

func refreshErrors(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	return counter(t, reg, "keepwarm_warmer_refresh_errors_total", map[string]string{"reason": reason})
}

func refreshes(t *testing.T, reg *prometheus.Registry, result string) float64 {
	return counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"result": result})
}

// A publish that gets an error reply (the meta key holds a string: WRONGTYPE, which only a keyspace that keeps
// meta can get) writes nothing, is counted as an error with reason wrongtype (not lock_lost), and releases its
// lock at once: once the meta key is fixed, the key is written long before the 60 s lock TTL would have let an
// orphaned lock go.
func TestPublishErrorReplyReleasesLock(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	ctx := context.Background()
	ks := f.keySet(t, "1")
	f.rdb.Set(ctx, ks.Meta, "not-a-hash", time.Minute)
	cfg := f.config("1")
	cfg.KeepMeta = true
	cfg.LockTTL = time.Minute
	_, reg, stop := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	testenv.Eventually(t, 10*time.Second, "a wrongtype error counted", func() bool { return refreshErrors(t, reg, warmer.ReasonWrongType) >= 1 })
	if n := f.rdb.Exists(ctx, ks.Cache).Val(); n != 0 {
		t.Errorf("cache key written by a publish that failed with WRONGTYPE")
	}
	f.rdb.Del(ctx, ks.Meta)
	testenv.Eventually(t, 15*time.Second, "key written after the meta key was fixed (well within the 60 s lock TTL)", func() bool {
		return f.rdb.Exists(ctx, ks.Cache).Val() == 1
	})
	stop()
	if got := refreshes(t, reg, warmer.ResultLockLost); got != 0 {
		t.Errorf("lock_lost = %v, want 0 (an error reply is not a lost lock)", got)
	}
	if locks := f.lockKeys(t, f.rdb); len(locks) != 0 {
		t.Errorf("orphaned locks after stop: %v", locks)
	}
}

// Under maxmemory with noeviction, Redis refuses the daemon's writes with OOM: counted as error/oom, never as
// lock_lost, and no lock is left behind; once memory is available again the key is written.
func TestOOMIsNotLockLost(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	ctx := context.Background()
	priv := testenv.PrivateRedis(t)
	ks := f.keySet(t, "1")
	if err := priv.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := priv.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	cfg := f.config("1")
	cfg.LockTTL = time.Minute
	_, reg, stop := start(t, priv, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	testenv.Eventually(t, 10*time.Second, "an oom error counted", func() bool { return refreshErrors(t, reg, warmer.ReasonOOM) >= 1 })
	if err := priv.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, "key written once memory is available", func() bool { return priv.Exists(ctx, ks.Cache).Val() == 1 })
	stop()
	if got := refreshes(t, reg, warmer.ResultLockLost); got != 0 {
		t.Errorf("lock_lost = %v, want 0 (OOM is not a lost lock)", got)
	}
	if locks := f.lockKeys(t, priv); len(locks) != 0 {
		t.Errorf("orphaned locks after stop: %v", locks)
	}
}

// freezeOnce is a go-redis hook that freezes the server while the first pipeline matching match is in flight,
// and thaws it as soon as the client has given up on it (its read timeout): the commands still run when the
// server thaws, like Redis waking from a 15 s stall with a batch of SET NX in its socket buffer.
type freezeOnce struct {
	t      *testing.T
	srv    *testenv.FreezableRedis
	match  func(cmds []redis.Cmder) bool
	frozen atomic.Bool
	done   chan error // the frozen pipeline's error
}

func (h *freezeOnce) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *freezeOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *freezeOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !h.match(cmds) || !h.frozen.CompareAndSwap(false, true) {
			return next(ctx, cmds)
		}
		h.srv.Freeze(h.t)
		err := next(ctx, cmds)
		h.srv.Thaw(h.t)
		h.done <- err
		return err
	}
}

// isAcquire matches the pipelined SET NX of lock acquisition.
func isAcquire(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		args := c.Args()
		if len(args) >= 4 && strings.EqualFold(c.Name(), "set") && strings.EqualFold(args[3].(string), "nx") {
			return true
		}
	}
	return false
}

// A pipelined lock acquisition that times out because Redis froze still runs when Redis wakes. The daemon
// releases the batch's locks (token-checked) once Redis answers, so the hot key is written within seconds, not
// after the 60 s lock TTL.
func TestFrozenRedisDuringAcquisitionLeavesNoLock(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	ctx := context.Background()
	srv := testenv.PrivateFreezableRedis(t)
	opt, err := redis.ParseURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	opt.ReadTimeout, opt.WriteTimeout, opt.MaxRetries = 300*time.Millisecond, 300*time.Millisecond, -1
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	hook := &freezeOnce{t: t, srv: srv, match: isAcquire, done: make(chan error, 1)}
	rdb.AddHook(hook)
	ks := f.keySet(t, "1")
	cfg := f.config("1")
	cfg.LockTTL = time.Minute
	_, reg, stop := start(t, rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	select {
	case err := <-hook.done:
		if err == nil {
			t.Fatal("the frozen acquisition did not fail; the test froze nothing")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no lock acquisition was sent within 20 s")
	}
	testenv.Eventually(t, 15*time.Second, "key written after the freeze (well within the 60 s lock TTL)", func() bool {
		return rdb.Exists(ctx, ks.Cache).Val() == 1
	})
	stop()
	if got := refreshErrors(t, reg, warmer.ReasonTransport); got < 1 {
		t.Errorf("transport errors = %v, want the frozen batch counted", got)
	}
	if locks := f.lockKeys(t, rdb); len(locks) != 0 {
		t.Errorf("orphaned locks after stop: %v", locks)
	}
}

// A hot key that expires while its refresh is in flight (the origin query is slow) is an SLO miss: the publish
// reports that the value was gone, and keepwarm_warmer_hot_expired_total counts it once.
func TestExpiryDuringRefreshIsCounted(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	ctx := context.Background()
	ks := f.keySet(t, "1")
	f.rdb.Set(ctx, ks.Cache, "v0", 3*time.Second) // learnt with more than one lead of notice
	var once sync.Once
	f.src.before = func([]string) {
		once.Do(func() {
			deadline := time.Now().Add(10 * time.Second)
			for f.rdb.Exists(ctx, ks.Cache).Val() == 1 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond) // wait for the event: the value has expired
			}
		})
	}
	cfg := f.config("1")
	_, reg, stop := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	testenv.Eventually(t, 15*time.Second, "the key rewritten", func() bool { return f.rdb.Get(ctx, ks.Cache).Val() != "v0" && f.rdb.Exists(ctx, ks.Cache).Val() == 1 })
	testenv.Eventually(t, 5*time.Second, "the expiry counted", func() bool {
		return counter(t, reg, "keepwarm_warmer_hot_expired_total", nil) >= 1
	})
	stop()
	if got := counter(t, reg, "keepwarm_warmer_hot_expired_total", nil); got != 1 {
		t.Errorf("hot_expired_total = %v, want exactly 1 (each expiry counts once)", got)
	}
}

// The usual invalidate-on-write races a refresh: the refresh read the old row, then the app commits an UPDATE
// and deletes the key and its lock (lockstep.Invalidate). The refresh's publish must fail (lock_gone) and the old
// row must never be written back; the next refresh publishes the new row.
func TestInvalidationBeatsInflightRefresh(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	ctx := context.Background()
	ks := f.keySet(t, "1")
	var once sync.Once
	f.src.after = func([]string) {
		once.Do(func() {
			if _, err := f.pool.Exec(ctx, "update "+f.table+" set body = jsonb_build_object('id', 1, 'v', 2) where id = '1'"); err != nil {
				t.Error(err)
			}
			if err := lockstep.Invalidate(ctx, f.rdb, ks); err != nil {
				t.Error(err)
			}
		})
	}
	cfg := f.config("1")
	_, reg, stop := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	testenv.Eventually(t, 10*time.Second, "the raced refresh counted as lock_gone", func() bool { return refreshes(t, reg, warmer.ResultLockGone) >= 1 })
	if v := f.rdb.Get(ctx, ks.Cache).Val(); strings.Contains(v, `"v": 1`) {
		t.Fatalf("old row written back after the invalidation: %s", v)
	}
	testenv.Eventually(t, 10*time.Second, "the new row published", func() bool { return strings.Contains(f.rdb.Get(ctx, ks.Cache).Val(), `"v": 2`) })
	stop()
	if locks := f.lockKeys(t, f.rdb); len(locks) != 0 {
		t.Errorf("orphaned locks after stop: %v", locks)
	}
}

// The same race through a warmup: the id is reported as failed (not written) and the old row is not cached.
func TestInvalidationBeatsInflightWarmup(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	ctx := context.Background()
	ks := f.keySet(t, "2")
	f.src.after = func([]string) {
		if _, err := f.pool.Exec(ctx, "update "+f.table+" set body = jsonb_build_object('id', 2, 'v', 2) where id = '2'"); err != nil {
			t.Error(err)
		}
		if err := lockstep.Invalidate(ctx, f.rdb, ks); err != nil {
			t.Error(err)
		}
	}
	w, err := warmer.New(f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{f.config()}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := w.Warmup(ctx, "items", warmer.SliceIDs([]string{"2"}), warmer.WarmupOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Written != 0 || res.Failed != 1 {
		t.Errorf("warmup = written %d, failed %d; want 0 and 1 (the invalidation won)", res.Written, res.Failed)
	}
	if n := f.rdb.Exists(ctx, ks.Cache).Val(); n != 0 {
		t.Errorf("old row cached by a warmup that lost to an invalidation: %s", f.rdb.Get(ctx, ks.Cache).Val())
	}
	if locks := f.lockKeys(t, f.rdb); len(locks) != 0 {
		t.Errorf("orphaned locks: %v", locks)
	}
}

// Two daemons keep a value alive through an origin outage, and max_stale bounds them together: at every moment
// the value's expiry (by the Redis server's clock) is at most stale_since + max_stale.
func TestTwoDaemonsShareMaxStale(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	ctx := context.Background()
	ks := f.keySet(t, "1")
	if _, err := f.pool.Exec(ctx, "alter table "+f.table+" rename to items_renamed"); err != nil { // the origin breaks
		t.Fatal(err)
	}
	f.rdb.Set(ctx, ks.Cache, "last good", 2*time.Second)
	const maxStale = 3 * time.Second
	cfg := f.config("1")
	cfg.MaxStale = maxStale
	_, reg1, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Seed: 1})
	_, reg2, _ := start(t, testenv.Redis(t), warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Seed: 2})
	deadline := time.Now().Add(20 * time.Second)
	for {
		var pttl *redis.DurationCmd
		var since *redis.StringCmd
		var now *redis.TimeCmd
		_, _ = f.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			pttl = p.PTTL(ctx, ks.Cache)
			since = p.HGet(ctx, ks.Meta, lockstep.MetaStaleSinceField)
			now = p.Time(ctx)
			return nil
		})
		if pttl.Val() < 0 {
			break // gone: the bound let it expire
		}
		if s, err := since.Int64(); err == nil {
			expiry := now.Val().Add(pttl.Val())
			if bound := time.UnixMilli(s).Add(maxStale); expiry.After(bound.Add(50 * time.Millisecond)) {
				t.Fatalf("value expires at %v, %v past stale_since + max_stale", expiry, expiry.Sub(bound))
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("value still alive after 20 s of origin outage with max_stale 3 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	ext := counter(t, reg1, "keepwarm_warmer_failsafe_extensions_total", nil) + counter(t, reg2, "keepwarm_warmer_failsafe_extensions_total", nil)
	if ext < 1 {
		t.Errorf("fail-safe extensions = %v, want ≥ 1 (else the test proved nothing)", ext)
	}
}

// A value over max_value_bytes is refused (too_large), never written; the old value is kept by the fail-safe.
func TestTooLargeKeepsOldValue(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	ctx := context.Background()
	ks := f.keySet(t, "1")
	f.rdb.Set(ctx, ks.Cache, "old", 2*time.Second)
	cfg := f.config("1")
	cfg.MaxValueBytes = 5
	_, reg, stop := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	testenv.Eventually(t, 10*time.Second, "a too_large result and a fail-safe extension", func() bool {
		return refreshes(t, reg, warmer.ResultTooLarge) >= 1 && counter(t, reg, "keepwarm_warmer_failsafe_extensions_total", nil) >= 1
	})
	stop()
	if v := f.rdb.Get(ctx, ks.Cache).Val(); v != "old" {
		t.Errorf("cache = %q, want the old value kept", v)
	}
	if got := refreshErrors(t, reg, warmer.ReasonOrigin); got != 0 {
		t.Errorf("origin errors = %v, want 0 (too large is its own result)", got)
	}
}

// lateSource fails its first fails Fetches with the deadline's error, each late by late after ctx's deadline
// (0: at once), then behaves. late > 0 is what a daemon paused (SIGSTOP) across a query's deadline sees: its
// timer fires long after it was due, although PostgreSQL answered long ago.
type lateSource struct {
	warmer.Source
	fails int32
	late  time.Duration
	n     atomic.Int32
}

func (s *lateSource) Fetch(ctx context.Context, ids []string) (map[string][]byte, []string, error) {
	if s.n.Add(1) <= s.fails {
		if s.late > 0 {
			<-ctx.Done()
			time.Sleep(s.late) // the resume comes long after the deadline
		}
		return nil, nil, fmt.Errorf("fetch: %w", context.DeadlineExceeded)
	}
	return s.Source.Fetch(ctx, ids)
}

// One client-side timeout is counted (origin_timeout) but does not declare the origin failing; the next query
// succeeds and the key is written.
func TestSingleClientTimeoutIsNoOutage(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	ctx := context.Background()
	var logs testenv.LogBuffer
	cfg := f.config("1")
	cfg.Src = &lateSource{Source: f.src, fails: 1}
	_, reg, stop := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	testenv.Eventually(t, 10*time.Second, "key written after one timeout", func() bool { return f.rdb.Exists(ctx, f.key("1")).Val() == 1 })
	stop()
	if got := refreshErrors(t, reg, warmer.ReasonOriginTimeout); got != 1 {
		t.Errorf("origin_timeout errors = %v, want 1", got)
	}
	if strings.Contains(logs.String(), "origin failing") {
		t.Errorf("one client-side timeout logged an origin outage:\n%s", logs.String())
	}
}

// The origin's capacity is exhausted: max_conns 2, and both connections are held by another keyspace's queries
// that hang until the server's statement timeout. A hot key of a second keyspace never expires meanwhile: its
// refresh waits at most pool_wait_timeout for a connection (the lead covers statement_timeout +
// pool_wait_timeout), and when none comes free in time (pool_exhausted) the fail-safe keeps the value until a
// connection does. Before, the refresh took its lock, waited for a connection past the value's expiry, and the
// SLO counter did not even move.
func TestPoolExhaustedDoesNotEatTheLead(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	ctx := context.Background()
	pool, err := postgres.NewPool(ctx, testenv.PostgresURL(), 2, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	newSrc := func(name, query string) warmer.Source {
		src, err := postgres.New(pool, postgres.Config{Keyspace: name, Query: query,
			StatementTimeout: 2 * time.Second, PoolWaitTimeout: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	// While hang is true the hog keyspace's queries hold both connections until the server's statement timeout.
	flag := strings.TrimSuffix(f.table, `"items"`) + `"hang"`
	if _, err := f.pool.Exec(ctx, "create table "+flag+" as select true as hang"); err != nil {
		t.Fatal(err)
	}
	hogKeys, err := lockstep.NewKeys(f.prefix+"hog:${id}", "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	hog := warmer.KeyspaceConfig{Name: "hog", Keys: hogKeys, TTL: 10 * time.Second, LockTTL: 5 * time.Second,
		Src: newSrc("hog", "select id, body from "+f.table+", pg_sleep(case when (select hang from "+flag+
			") then 30 else 0 end) where id = any($1)"),
		StatementTimeout: 2 * time.Second, PoolWaitTimeout: 300 * time.Millisecond,
		BatchSize: 1, MaxOriginConcurrency: 2, Pinned: []string{"1", "2"}, AccessKey: f.prefix + "hog-access",
		PollInterval: 200 * time.Millisecond, ReconcileEvery: 300 * time.Millisecond}
	fast := f.config("1")
	fast.Src = newSrc("items", "select id, body from "+f.table+" where id = any($1)")
	fast.TTL, fast.RefreshAhead, fast.LockTTL = 6*time.Second, time.Second, 5*time.Second
	fast.StatementTimeout, fast.PoolWaitTimeout = 2*time.Second, 300*time.Millisecond
	ks := f.keySet(t, "1")
	f.rdb.Set(ctx, ks.Cache, "v0", 4*time.Second)
	_, reg, stop := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{hog, fast}})
	items := map[string]string{"keyspace": "items"}
	okRefreshes := func() float64 {
		return counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"keyspace": "items", "result": "ok"})
	}
	exhausted := func() float64 {
		return counter(t, reg, "keepwarm_warmer_refresh_errors_total", map[string]string{"keyspace": "items", "reason": warmer.ReasonPoolExhausted})
	}
	// Phase 1: the pool stays exhausted until the hot key's refresh has failed for it three times (and its value
	// was kept past its first expiry), or until a connection came free between the hog's queries and the key was
	// refreshed; phase 2: the hog lets go and the key must be refreshed. The key must exist at every look
	// throughout.
	released := false
	var exhaustedBeforeOK float64 // the hot key's pool_exhausted errors, read before the ok refresh was seen
	deadline := time.Now().Add(60 * time.Second)
	for {
		ex := exhausted() // read first: it counts only errors from before the ok check below
		if okRefreshes() >= 1 {
			exhaustedBeforeOK = ex
			break
		}
		if f.rdb.Exists(ctx, ks.Cache).Val() == 0 {
			t.Fatalf("the hot key expired while the pool was exhausted (ok refreshes so far: %v, pool_exhausted: %v)",
				okRefreshes(), exhausted())
		}
		if !released && ex >= 3 {
			if _, err := f.pool.Exec(ctx, "update "+flag+" set hang = false"); err != nil {
				t.Fatal(err)
			}
			released = true
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ok refresh of the hot key in 60 s (released: %v, pool_exhausted: %v)", released, exhausted())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Else the test proved nothing: the key was refreshed from a pool that was never exhausted for it.
	if exhaustedBeforeOK < 1 {
		t.Fatalf("the hot key was refreshed without ever finding the pool exhausted (pool_exhausted{keyspace=items} = %v before its ok refresh): the hog did not exhaust the pool",
			exhaustedBeforeOK)
	}
	stop()
	if got := counter(t, reg, "keepwarm_warmer_hot_expired_total", items); got != 0 {
		t.Errorf("SLO counter = %v, want 0", got)
	}
	t.Logf("pool_exhausted errors of the hot key: %v before its ok refresh, %v in all; fail-safe extensions: %v; released by the test: %v",
		exhaustedBeforeOK, exhausted(), counter(t, reg, "keepwarm_warmer_failsafe_extensions_total", items), released)
}

// Deadlines that fire late because the process was paused are not origin failures, however many in a row.
func TestPausedDaemonIsNoOutage(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	ctx := context.Background()
	var logs testenv.LogBuffer
	cfg := f.config("1")
	cfg.Src = &lateSource{Source: f.src, fails: 2, late: 1500 * time.Millisecond}
	_, _, stop := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	testenv.Eventually(t, 20*time.Second, "key written after two paused queries", func() bool { return f.rdb.Exists(ctx, f.key("1")).Val() == 1 })
	stop()
	if strings.Contains(logs.String(), "origin failing") {
		t.Errorf("a paused daemon logged an origin outage:\n%s", logs.String())
	}
	if n := strings.Count(logs.String(), "this process was paused"); n != 2 {
		t.Errorf("paused queries noticed %d times, want 2:\n%s", n, logs.String())
	}
}
