package warmer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
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

// The SLO tests: every miss an independent observer sees is counted by
// keepwarm_warmer_hot_expired_total, once per expiry, whoever rebuilt the key afterwards; an invalidation is not
// a miss. The observer is a poller with its own Redis client: it trusts nothing the daemon says.

// gap is one stretch of time during which an observed key was absent.
type gap struct {
	key        string
	start, end time.Time
}

// observer polls keys with pipelined EXISTS every 20 ms from its own client (a copy of rdb's options) and records
// every gap: a key absent after it had been seen present. It trusts nothing the daemon says.
type observer struct {
	mu     sync.Mutex
	gaps   []gap
	open   map[string]time.Time
	seen   map[string]bool
	polls  int // polls that got an answer
	cancel context.CancelFunc
	done   chan struct{}
}

func observe(t *testing.T, rdb *redis.Client, keys ...string) *observer {
	t.Helper()
	c := redis.NewClient(rdb.Options())
	ctx, cancel := context.WithCancel(context.Background())
	o := &observer{open: map[string]time.Time{}, seen: map[string]bool{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(o.done)
		defer c.Close()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			cmds := make([]*redis.IntCmd, len(keys))
			_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i, k := range keys {
					cmds[i] = p.Exists(ctx, k)
				}
				return nil
			})
			now := time.Now()
			if err == nil {
				o.mu.Lock()
				o.polls++
				for i, k := range keys {
					present := cmds[i].Val() == 1
					start, inGap := o.open[k]
					switch {
					case present && inGap:
						o.gaps = append(o.gaps, gap{k, start, now})
						delete(o.open, k)
					case !present && !inGap && o.seen[k]:
						o.open[k] = now
					}
					if present {
						o.seen[k] = true
					}
				}
				o.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(o.stop)
	return o
}

// stop ends the polling; it may be called more than once.
func (o *observer) stop() {
	o.cancel()
	<-o.done
}

// all returns every gap so far, those still open ending now.
func (o *observer) all() []gap {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := append([]gap(nil), o.gaps...)
	for k, start := range o.open {
		out = append(out, gap{k, start, time.Now()})
	}
	return out
}

// pollsSoFar returns how many polls got an answer, for waiting until the observer has looked again.
func (o *observer) pollsSoFar() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.polls
}

// closed returns the gaps that have ended so far.
func (o *observer) closed() []gap {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]gap(nil), o.gaps...)
}

func sloMisses(t *testing.T, reg *prometheus.Registry) float64 {
	return counter(t, reg, "keepwarm_warmer_hot_expired_total", nil)
}

// An app that holds a key's lock across three expiries (its rebuild hangs, then it writes the value late, and
// again) causes three misses, and the SLO counter says three: each new value re-arms the count, not only the
// daemon's own publish (before: 1).
func TestAppHoldingTheLockAcrossExpiriesIsCountedEachTime(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	ctx := context.Background()
	ks := f.keySet(t, "1")
	const appToken = "app-token"
	f.rdb.Set(ctx, ks.Lock, appToken, time.Minute)
	f.rdb.Set(ctx, ks.Cache, "app v0", 1500*time.Millisecond)
	obs := observe(t, f.rdb, ks.Cache)
	_, reg, stop := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{f.config("1")}})
	for i := 1; i <= 3; i++ {
		testenv.Eventually(t, 10*time.Second, "the app's value expired", func() bool { return f.rdb.Exists(ctx, ks.Cache).Val() == 0 })
		time.Sleep(300 * time.Millisecond) // the app's rebuild is slow: a gap the observer must see
		f.rdb.Set(ctx, ks.Cache, "app v"+strconv.Itoa(i), 1500*time.Millisecond)
		testenv.Eventually(t, 10*time.Second, "the observer saw the gap", func() bool { return len(obs.closed()) >= i })
	}
	f.rdb.Del(ctx, ks.Lock) // the app lets go; the daemon takes over
	testenv.Eventually(t, 10*time.Second, "three misses counted", func() bool { return sloMisses(t, reg) >= 3 })
	testenv.Eventually(t, 10*time.Second, "the daemon writes the key", func() bool {
		v := f.rdb.Get(ctx, ks.Cache).Val()
		return v != "" && v[0] == '{'
	})
	stop()
	obs.stop()
	if got, want := sloMisses(t, reg), float64(len(obs.closed())); got != want {
		t.Errorf("SLO counter = %v, observer saw %v gaps (%v); want equal", got, want, obs.closed())
	}
}

// The lead can be raised far above refresh_ahead (statement_timeout + pool_wait_timeout). A key an app wrote
// with less than one lead left is "short notice", but the daemon still had time to try: when its attempts fail and
// the key expires, that is an SLO miss (before: only hot_late_notice_total moved). late_notice stays a
// breakdown of the misses.
func TestShortNoticeDoesNotHideAFailedKey(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	ctx := context.Background()
	ks := f.keySet(t, "1")
	cfg := f.config("1")
	cfg.Src = failingSource{}
	cfg.TTL, cfg.StatementTimeout, cfg.PoolWaitTimeout = 10*time.Second, 2*time.Second, time.Second // lead 3 s
	cfg.LockTTL, cfg.MaxStale = 5*time.Second, 200*time.Millisecond
	f.rdb.Set(ctx, ks.Cache, "app value", 2*time.Second) // less than the lead: short notice
	obs := observe(t, f.rdb, ks.Cache)
	_, reg, stop := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	testenv.Eventually(t, 10*time.Second, "the key expired", func() bool { return f.rdb.Exists(ctx, ks.Cache).Val() == 0 })
	testenv.Eventually(t, 10*time.Second, "the miss counted", func() bool { return sloMisses(t, reg) >= 1 })
	f.rdb.Set(ctx, ks.Cache, "app rebuilt", 5*time.Second) // closes the observer's gap
	testenv.Eventually(t, 5*time.Second, "the observer saw the gap", func() bool { return len(obs.closed()) >= 1 })
	stop()
	if errs := refreshErrors(t, reg, warmer.ReasonOrigin); errs < 1 {
		t.Errorf("origin errors = %v, want ≥ 1 (the daemon tried)", errs)
	}
	if got := sloMisses(t, reg); got != 1 {
		t.Errorf("SLO counter = %v, want 1", got)
	}
	if got := counter(t, reg, "keepwarm_warmer_hot_late_notice_total", nil); got != 1 {
		t.Errorf("late_notice = %v, want 1 (the breakdown of the one miss)", got)
	}
}

// startFlushDaemon starts a warmer on a private Redis with notifications on, three pinned keys of a 10-minute TTL
// (written once, then trusted) and the flush canary rewritten every flushEvery (0: the default), and waits until
// the keys are written and notifications are healthy.
func startFlushDaemon(t *testing.T, flushEvery time.Duration) (*warmer.Warmer, *redis.Client, []string, *prometheus.Registry, func()) {
	t.Helper()
	f := newFixture(t, 5)
	ctx := context.Background()
	priv := testenv.PrivateRedis(t)
	setConfig(t, priv, "notify-keyspace-events", "Exeg$")
	cfg := f.config("1", "2", "3")
	cfg.TTL, cfg.ReconcileTrustedEvery = 10*time.Minute, 5*time.Minute
	keys := []string{f.key("1"), f.key("2"), f.key("3")}
	w, reg, stop := start(t, priv, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Notifications: true,
		FlushCheckInterval: flushEvery})
	testenv.Eventually(t, 10*time.Second, "all three written", func() bool { return priv.Exists(ctx, keys...).Val() == 3 })
	testenv.Eventually(t, 10*time.Second, "notifications healthy", func() bool {
		return counter(t, reg, "keepwarm_warmer_notifications_enabled", nil) == 1
	})
	return w, priv, keys, reg, stop
}

// FLUSHDB publishes no per-key event, and with notifications healthy the daemon's own writes are trusted and
// re-read only every 5 minutes: before, hot keys stayed gone for minutes and nothing was counted. The flush
// canary notices within a fraction of a second: every hot key is re-read, each is counted once as a miss, and
// all are rebuilt.
func TestFlushIsNoticedCountedAndRebuilt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, priv, keys, reg, stop := startFlushDaemon(t, 0)
	obs := observe(t, priv, keys...)
	testenv.Eventually(t, 5*time.Second, "the observer saw the keys", func() bool {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		return len(obs.seen) == 3
	})
	if err := priv.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the flush noticed", func() bool {
		return counter(t, reg, "keepwarm_warmer_flushes_detected_total", nil) == 1
	})
	testenv.Eventually(t, 10*time.Second, "all three rebuilt", func() bool { return priv.Exists(ctx, keys...).Val() == 3 })
	testenv.Eventually(t, 5*time.Second, "three misses counted", func() bool { return sloMisses(t, reg) >= 3 })
	testenv.Eventually(t, 5*time.Second, "the observer saw the gaps end", func() bool { return len(obs.closed()) >= 3 })
	stop()
	obs.stop()
	if got := sloMisses(t, reg); got != 3 {
		t.Errorf("SLO counter = %v, want 3 (one per flushed hot key)", got)
	}
	if got := len(obs.closed()); got != 3 {
		t.Errorf("observer gaps = %d (%v), want 3", got, obs.closed())
	}
	for _, g := range obs.closed() {
		t.Logf("gap of %s: %v", g.key, g.end.Sub(g.start))
	}
}

// A key whose value the daemon learnt after the flush canary's last write is not counted at once when the canary
// finds Redis emptied (a value learnt since may be a rebuild after the flush); it is read again. Found present
// with another expiry, an app has rebuilt it after the flush: the value the daemon knew was lost, a miss. Before,
// that reading was judged like any other (the known expiry had not passed: no miss), and a 10-minute soak left
// 116 gaps after three Redis restarts without a count.
func TestFlushCountsAKeyAnAppRebuiltBeforeTheReread(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w, priv, keys, reg, stop := startFlushDaemon(t, 3*time.Second)
	// Wait for the canary's write, then, well within the 3 s before the next: an app rewrites key 1, the daemon
	// learns its expiry, Redis is flushed, and the app rebuilds key 1 at once.
	var canary string
	testenv.Eventually(t, 10*time.Second, "the canary key", func() bool {
		ks, _ := priv.Keys(ctx, "keepwarm:canary:*").Result()
		if len(ks) == 1 {
			canary = ks[0]
		}
		return canary != ""
	})
	last := priv.PTTL(ctx, canary).Val()
	testenv.Eventually(t, 10*time.Second, "the canary rewritten", func() bool {
		p := priv.PTTL(ctx, canary).Val()
		rewritten := p > last
		last = p
		return rewritten
	})
	// Twice: the first "set" after the daemon's own write is taken as that write's notification when the daemon
	// wrote before it had subscribed (ownSetWindow).
	for _, v := range []string{"app", "app again"} {
		if err := priv.Set(ctx, keys[0], v, 7*time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 2*time.Second, "the daemon learnt the app's value", func() bool {
		for _, k := range w.Status(0)[0].Keys {
			if k.ID == "1" {
				return k.TTL > 0 && k.TTL < 8*time.Minute
			}
		}
		return false
	})
	if err := priv.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := priv.Set(ctx, keys[0], "app rebuild", 9*time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the flush noticed", func() bool {
		return counter(t, reg, "keepwarm_warmer_flushes_detected_total", nil) == 1
	})
	testenv.Eventually(t, 10*time.Second, "keys 2 and 3 rebuilt", func() bool { return priv.Exists(ctx, keys...).Val() == 3 })
	testenv.Eventually(t, 5*time.Second, "three misses counted", func() bool { return sloMisses(t, reg) >= 3 })
	stop()
	if got := sloMisses(t, reg); got != 3 {
		t.Errorf("SLO counter = %v, want 3 (every hot key was flushed; key 1 was rebuilt by an app before the re-read)", got)
	}
}

// An app invalidates keys (lockstep.Invalidate) while their refreshes are in flight, just before the values the
// daemon knew would have expired. The refresh's publish fails (lock_gone), the old row is never written, and the
// key is rebuilt at once with the new row. That is an invalidation, not a miss: before, the daemon re-read the
// key a while later, after the old expiry, and counted it (14 of 40).
func TestInvalidationDuringRefreshIsNoMiss(t *testing.T) {
	t.Parallel()
	const n = 10
	f := newFixture(t, n)
	ctx := context.Background()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = strconv.Itoa(i + 1)
	}
	var invalidated atomic.Int64
	f.src.after = func(batch []string) {
		if invalidated.Load() >= 40 {
			return
		}
		for _, id := range batch {
			ks, err := f.keys.For(id)
			if err != nil {
				t.Error(err)
				return
			}
			// Only a cached value is invalidated, just before it would expire, so that any later look is past
			// the expiry the daemon knew.
			p := f.rdb.PTTL(ctx, ks.Cache).Val()
			if p <= 0 {
				continue
			}
			deadline := time.Now().Add(5 * time.Second)
			for ; p > 60*time.Millisecond && time.Now().Before(deadline); p = f.rdb.PTTL(ctx, ks.Cache).Val() {
				time.Sleep(5 * time.Millisecond)
			}
			if _, err := f.pool.Exec(ctx, "update "+f.table+" set body = jsonb_build_object('id', id::int, 'v', 2) where id = $1", id); err != nil {
				t.Error(err)
			}
			if err := lockstep.Invalidate(ctx, f.rdb, ks); err != nil {
				t.Error(err)
			}
			invalidated.Add(1)
		}
	}
	cfg := f.config(ids...)
	cfg.BatchSize = 1
	// One origin slot per key: the hook holds its batch's slot until the key's value is about to expire, so with
	// fewer slots the other keys' refreshes wait behind it and, on a loaded machine, expire for want of a slot (a
	// real miss, but not what this test is about: 4 of 8 runs beside stress-ng --cpu 2 failed so).
	cfg.MaxOriginConcurrency = n
	_, reg, stop := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	testenv.Eventually(t, 60*time.Second, "40 invalidations during refreshes", func() bool { return invalidated.Load() >= 40 })
	testenv.Eventually(t, 10*time.Second, "every key holds its new row", func() bool {
		for _, id := range ids {
			var v struct{ V int }
			if err := jsonOf(f.rdb.Get(ctx, f.key(id)).Val(), &v); err != nil || v.V != 2 {
				return false
			}
		}
		return true
	})
	stop()
	if got := refreshes(t, reg, warmer.ResultLockGone); got < 40 {
		t.Errorf("lock_gone = %v, want ≥ 40 (else the invalidations did not race the refreshes)", got)
	}
	if got := sloMisses(t, reg); got != 0 {
		t.Errorf("SLO counter = %v, want 0: an invalidation is not a miss", got)
	}
	if locks := f.lockKeys(t, f.rdb); len(locks) != 0 {
		t.Errorf("orphaned locks after stop: %v", locks)
	}
}

// pauseHook blocks every command of the client it is added to while paused: the daemon stalls (a SIGSTOP, a VM
// freeze) while Redis and the apps go on.
type pauseHook struct {
	mu     sync.Mutex
	paused chan struct{} // closed when unpaused; nil when not paused
}

func (h *pauseHook) pause() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.paused == nil {
		h.paused = make(chan struct{})
	}
}

func (h *pauseHook) resume() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.paused != nil {
		close(h.paused)
		h.paused = nil
	}
}

func (h *pauseHook) wait(ctx context.Context) error {
	h.mu.Lock()
	ch := h.paused
	h.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *pauseHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *pauseHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := h.wait(ctx); err != nil {
			return err
		}
		return next(ctx, cmd)
	}
}
func (h *pauseHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := h.wait(ctx); err != nil {
			return err
		}
		return next(ctx, cmds)
	}
}

// The daemon stalls while a hot key expires and an app rebuilds it. When the daemon wakes, the key is there with
// a fresh TTL, which looked like "an app rewrote it" and counted nothing (before: 39 of 1,094 missed reads
// counted). Judged against the expiry the daemon knew, it is a miss.
func TestStalledDaemonCountsKeysAppsRebuilt(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	ctx := context.Background()
	ks := f.keySet(t, "1")
	rdb := redis.NewClient(f.rdb.Options())
	t.Cleanup(func() { rdb.Close() })
	hook := &pauseHook{}
	rdb.AddHook(hook)
	obs := observe(t, f.rdb, ks.Cache)
	_, reg, stop := start(t, rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{f.config("1")}})
	testenv.Eventually(t, 10*time.Second, "the daemon wrote the key", func() bool { return f.rdb.Exists(ctx, ks.Cache).Val() == 1 })
	hook.pause()
	testenv.Eventually(t, 10*time.Second, "the key expired while the daemon stalled", func() bool {
		return f.rdb.Exists(ctx, ks.Cache).Val() == 0
	})
	time.Sleep(300 * time.Millisecond) // the app's miss path takes a while
	f.rdb.Set(ctx, ks.Cache, "app rebuilt", 2*time.Second)
	hook.resume()
	testenv.Eventually(t, 10*time.Second, "the miss counted", func() bool { return sloMisses(t, reg) >= 1 })
	testenv.Eventually(t, 5*time.Second, "the observer saw the gap", func() bool { return len(obs.closed()) >= 1 })
	stop()
	obs.stop()
	if got, want := sloMisses(t, reg), float64(len(obs.closed())); got != want {
		t.Errorf("SLO counter = %v, observer saw %v gaps; want equal", got, want)
	}
}

// PostgreSQL is down and the fail-safe keeps every hot value: the extension and its retry are one decision, so
// the retry always lands inside the extended life and no value expires (before: two independent back-off draws,
// and 447 of 734 hot keys expired in a 150 s outage). An independent observer sees no gap.
func TestFailSafeRetryLandsInsideTheExtension(t *testing.T) {
	t.Parallel()
	const n = 20
	f := newFixture(t, n)
	ctx := context.Background()
	ids := make([]string, n)
	keys := make([]string, n)
	for i := range ids {
		ids[i] = strconv.Itoa(i + 1)
		keys[i] = f.key(ids[i])
		f.rdb.Set(ctx, keys[i], "last good", 3*time.Second)
	}
	cfg := f.config(ids...)
	cfg.Src = failingSource{}
	cfg.TTL, cfg.MaxStale = 10*time.Second, 5*time.Minute // back-off up to 5 s: draws far apart
	cfg.BatchSize = 1
	obs := observe(t, f.rdb, keys...)
	_, reg, stop := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Seed: 7})
	testenv.Eventually(t, 60*time.Second, "five fail-safe rounds per key", func() bool {
		return counter(t, reg, "keepwarm_warmer_failsafe_extensions_total", nil) >= 5*n
	})
	stop()
	obs.stop()
	if gaps := obs.closed(); len(gaps) != 0 {
		t.Errorf("observer saw %d gaps during the outage, want 0: %v", len(gaps), gaps)
	}
	if n := f.rdb.Exists(ctx, keys...).Val(); n != int64(len(keys)) {
		t.Errorf("%d of %d values alive at the end, want all", n, len(keys))
	}
	if got := sloMisses(t, reg); got != 0 {
		t.Errorf("SLO counter = %v, want 0", got)
	}
}

func jsonOf(s string, v any) error { return json.Unmarshal([]byte(s), v) }

// A FLUSHDB also empties the fleet's member set. Before, the first replica to heartbeat afterwards saw itself
// alone and took every key, then gave them back as the others beat again, and each owner in turn counted the
// flushed keys: the fleet counted 1,186 misses for 734 flushed hot keys in a soak. And a key a replica's
// reconciliation found gone and rebuilt before its canary fired must not be counted again by the canary. Each
// flushed hot key must be counted once, by one replica.
func TestFlushCountedOnceAcrossTheFleet(t *testing.T) {
	t.Parallel()
	const n = 30
	f := newFixture(t, n)
	ctx := context.Background()
	priv := testenv.PrivateRedis(t)
	ids := pinnedIDs(n)
	long := func(cfg *warmer.KeyspaceConfig) { cfg.TTL, cfg.RefreshAhead = 4*time.Second, 2*time.Second }
	var rs []*replica
	for _, id := range []string{"a", "b", "c"} {
		rs = append(rs, startLeaseReplica(t, f, redis.NewClient(priv.Options()), id, ids, long))
	}
	keys := keysOf(f, ids)
	testenv.Eventually(t, 15*time.Second, "three members, every key written", func() bool {
		for _, r := range rs {
			if len(r.w.Fleet().Members) != 3 {
				return false
			}
		}
		return priv.Exists(ctx, keys...).Val() == n
	})
	sum := func(name string) (total float64) {
		for _, r := range rs {
			total += counter(t, r.reg, name, nil)
		}
		return total
	}
	// Each key refreshed twice more by the fleet, so that ownership has settled and every owner knows its keys
	// (a key taken over less than one TTL after it became hot is not judged: its first owner may not have
	// written it yet).
	ok0 := sum("keepwarm_warmer_refreshes_total")
	testenv.Eventually(t, 20*time.Second, "two more refresh rounds", func() bool {
		return sum("keepwarm_warmer_refreshes_total") >= ok0+2*n
	})
	obs := observe(t, priv, keys...)
	testenv.Eventually(t, 5*time.Second, "the observer saw every key", func() bool {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		return len(obs.seen) == n
	})
	before := sum("keepwarm_warmer_hot_expired_total")
	flushed := time.Now()
	if err := priv.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	state := func() string {
		s := fmt.Sprintf("keys present %d of %d, counted %v;", priv.Exists(ctx, keys...).Val(), n, sum("keepwarm_warmer_hot_expired_total"))
		for _, r := range rs {
			s += fmt.Sprintf(" %s: flushes %v, owned %d, members %s;", r.id,
				counter(t, r.reg, "keepwarm_warmer_flushes_detected_total", nil), owned(r.w), members(r.w))
		}
		return s
	}
	if !testenv.Poll(15*time.Second, func() bool {
		for _, r := range rs {
			if counter(t, r.reg, "keepwarm_warmer_flushes_detected_total", nil) < 1 {
				return false
			}
		}
		return priv.Exists(ctx, keys...).Val() == n && sum("keepwarm_warmer_hot_expired_total")-before >= n
	}) {
		t.Fatalf("every replica noticed, every key rebuilt and counted: not within 15 s: %s", state())
	}
	// Three more heartbeats of every replica: any flapping of the member list would have happened by then.
	beats := make([]float64, len(rs))
	for i, r := range rs {
		beats[i] = counter(t, r.reg, "keepwarm_warmer_fleet_heartbeats_total", nil)
	}
	testenv.Eventually(t, 10*time.Second, "three more heartbeats each", func() bool {
		for i, r := range rs {
			if counter(t, r.reg, "keepwarm_warmer_fleet_heartbeats_total", nil) < beats[i]+3 {
				return false
			}
		}
		return true
	})
	obs.stop()
	// The flush removed the n keys at one instant (the test did it; a rebuild within the observer's 20 ms poll
	// hides a gap from it, not from Redis). Any other gap would be another miss, to be counted as well.
	others := 0
	for _, g := range obs.all() {
		if g.start.After(flushed.Add(time.Second)) {
			others++
		}
	}
	// Each flushed key once, in one replica: the miss claims (missclaim.go) settle the few keys two replicas
	// judged while the fleet's view settled after the flush (before them this test allowed 20% either way; before
	// the flush fixes the fleet counted 62% too many in a soak, 1,186 for 734).
	if got := sum("keepwarm_warmer_hot_expired_total") - before; got != float64(n+others) {
		t.Errorf("the fleet counted %v misses since the flush, want %d: %d flushed keys, each once in one replica, and %d later gaps the observer saw",
			got, n+others, n, others)
	}
}

// The origin hangs (a table lock: every query waits until its statement timeout) while many hot keys come due,
// and the keyspace has one origin slot. Before, each key waited for that slot behind queries that each hung for
// the whole timeout, and its value expired before a fail-safe could extend it (the soak's pool-exhaustion fault:
// 446 gaps of up to 15 s). Now, while the origin's last query failed and every slot is taken, due keys are
// extended by a Redis-only fail-safe batch: no value expires, and no origin query is skipped once it answers.
func TestHungOriginFailSafeDoesNotWaitForSlots(t *testing.T) {
	t.Parallel()
	const n = 20
	f := newFixture(t, n)
	ctx := context.Background()
	flag := strings.TrimSuffix(f.table, `"items"`) + `"hang"`
	if _, err := f.pool.Exec(ctx, "create table "+flag+" as select false as hang"); err != nil {
		t.Fatal(err)
	}
	ids := pinnedIDs(n)
	cfg := f.config(ids...)
	cfg.TopN = 0
	src, err := postgres.New(f.pool, postgres.Config{Keyspace: "items", StatementTimeout: time.Second,
		Query: "select id, body from " + f.table + ", pg_sleep(case when (select hang from " + flag + ") then 30 else 0 end) where id = any($1)"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Src = src
	// The one key of a probe batch has lead − statement timeout (1.5 s) between its query's failure and its
	// expiry; every other due key is extended without waiting for the slot.
	cfg.TTL, cfg.RefreshAhead, cfg.Jitter = 6*time.Second, 2500*time.Millisecond, 0.5
	cfg.StatementTimeout, cfg.LockTTL = time.Second, 3*time.Second
	cfg.BatchSize, cfg.MaxOriginConcurrency = 1, 1
	keys := keysOf(f, ids)
	_, reg, stop := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	testenv.Eventually(t, 15*time.Second, "every key written", func() bool { return f.rdb.Exists(ctx, keys...).Val() == n })
	obs := observe(t, f.rdb, keys...)
	if _, err := f.pool.Exec(ctx, "update "+flag+" set hang = true"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "three fail-safe rounds per key", func() bool {
		return counter(t, reg, "keepwarm_warmer_failsafe_extensions_total", nil) >= 3*n
	})
	if _, err := f.pool.Exec(ctx, "update "+flag+" set hang = false"); err != nil {
		t.Fatal(err)
	}
	ok0 := refreshes(t, reg, warmer.ResultOK)
	testenv.Eventually(t, 30*time.Second, "every key refreshed from the origin again", func() bool {
		return refreshes(t, reg, warmer.ResultOK) >= ok0+n
	})
	stop()
	obs.stop()
	t.Logf("origin_failing (extended without a query): %v, origin_timeout: %v", refreshErrors(t, reg, warmer.ReasonOriginFailing),
		refreshErrors(t, reg, warmer.ReasonOriginTimeout))
	if gaps := obs.all(); len(gaps) != 0 {
		t.Errorf("observer saw %d gaps while the origin hung, want 0: %v", len(gaps), gaps)
	}
	if got := sloMisses(t, reg); got != 0 {
		t.Errorf("SLO counter = %v, want 0", got)
	}
}

// One replica of two stalls (a SIGSTOP, a VM freeze) for longer than its heartbeat TTL and its keys' expiries.
// The other takes its keys over and refreshes them in time: no key is missed. When the stalled one wakes, what it
// knew of its keys is stale; judged against it, every key the other refreshed looked "rebuilt after it expired"
// (the soak's daemon-sigstop fault: 32 counted for 4 gaps). It must re-learn them, and count nothing.
func TestStalledReplicaDoesNotCountItsHeirsRefreshes(t *testing.T) {
	t.Parallel()
	const n = 20
	f := newFixture(t, n)
	ctx := context.Background()
	ids := pinnedIDs(n)
	keys := keysOf(f, ids)
	mutate := func(cfg *warmer.KeyspaceConfig) {
		// A wide jitter: the heir's values carry TTLs up to 1.5 s above ttl, which is what made their write times
		// look later than the stale expiry.
		cfg.TTL, cfg.RefreshAhead, cfg.LockTTL, cfg.Jitter = 3*time.Second, 1500*time.Millisecond, time.Second, 0.5
	}
	stalled := redis.NewClient(f.rdb.Options())
	t.Cleanup(func() { stalled.Close() })
	hook := &pauseHook{}
	stalled.AddHook(hook)
	a := startLeaseReplica(t, f, stalled, "a", ids, mutate)
	b := startLeaseReplica(t, f, testenv.Redis(t), "b", ids, mutate)
	testenv.Eventually(t, 15*time.Second, "two members, every key written, a owns some", func() bool {
		return len(a.w.Fleet().Members) == 2 && len(b.w.Fleet().Members) == 2 && owned(a.w) > 0 &&
			f.rdb.Exists(ctx, keys...).Val() == n
	})
	obs := observe(t, f.rdb, keys...)
	hook.pause()
	// b notices a is gone, takes its keys over and refreshes each of them at least once.
	before := map[string]int{}
	for _, id := range ids {
		before[id] = b.src.count(id)
	}
	testenv.Eventually(t, 20*time.Second, "b refreshed every key", func() bool {
		for _, id := range ids {
			if b.src.count(id) <= before[id] {
				return false
			}
		}
		return true
	})
	hook.resume()
	testenv.Eventually(t, 10*time.Second, "a back in the fleet and owning keys", func() bool {
		return len(b.w.Fleet().Members) == 2 && owned(a.w) > 0 && owned(b.w) < n
	})
	// Two TTLs more with both replicas back: every key refreshed again.
	ok0 := counter(t, a.reg, "keepwarm_warmer_refreshes_total", nil) + counter(t, b.reg, "keepwarm_warmer_refreshes_total", nil)
	testenv.Eventually(t, 20*time.Second, "another refresh round", func() bool {
		return counter(t, a.reg, "keepwarm_warmer_refreshes_total", nil)+counter(t, b.reg, "keepwarm_warmer_refreshes_total", nil) >= ok0+2*n
	})
	obs.stop()
	gaps := obs.all()
	got := counter(t, a.reg, "keepwarm_warmer_hot_expired_total", nil) + counter(t, b.reg, "keepwarm_warmer_hot_expired_total", nil)
	// One count more than the observer saw is allowed: a key missed for less than its 20 ms poll is invisible
	// to it, and the replicas' views settling after the stall can still count one key twice (seen once, under
	// load, in a clean-clone make test). Before the lapsed-heartbeat rule the soak saw 32 counted for 4 gaps.
	if got < float64(len(gaps)) || got > float64(len(gaps)+1) {
		t.Errorf("the fleet counted %v misses; the observer saw %d gaps (%v); want as many (or one more)", got, len(gaps), gaps)
	}
}

// Redis stalls (a SIGSTOP here; a Sentinel failover or a restart does the same to the fleet) for longer than the
// heartbeat TTL and every hot key's TTL: every key expires once, and every replica's heartbeat lapses. The first
// replica back sees itself alone, takes every key over and counts the gone ones; their owners, back a beat
// later, judged them against the expiries they knew and counted them again (the Sentinel soak: 816 counted for
// 681 gaps). Each expiry must be counted once, in one replica: n keys, n misses.
func TestSharedOutageCountsEachMissOnce(t *testing.T) {
	t.Parallel()
	t.Run("daemons rebuild", func(t *testing.T) { sharedOutage(t, false) })
	// Apps rebuild every key the moment Redis answers again (their reads were waiting on it), before any
	// replica has read a key back. Before, every replica had forgotten the expiries it knew when its heartbeat
	// lapsed, judged the apps' values as new ones, and counted nothing (the Sentinel soak's 56 uncounted gaps).
	t.Run("apps rebuild at once", func(t *testing.T) { sharedOutage(t, true) })
}

func sharedOutage(t *testing.T, appsRebuild bool) {
	const n = 30
	f := newFixture(t, n)
	ctx := context.Background()
	frz := testenv.PrivateFreezableRedis(t)
	opt, err := redis.ParseURL(frz.URL)
	if err != nil {
		t.Fatal(err)
	}
	priv := redis.NewClient(opt)
	t.Cleanup(func() { priv.Close() })
	ids := pinnedIDs(n)
	short := func(cfg *warmer.KeyspaceConfig) { cfg.TTL, cfg.RefreshAhead = 3*time.Second, 1500*time.Millisecond }
	var rs []*replica
	for _, id := range []string{"a", "b", "c"} {
		rs = append(rs, startLeaseReplica(t, f, redis.NewClient(opt), id, ids, short))
	}
	keys := keysOf(f, ids)
	sum := func(name string) (total float64) {
		for _, r := range rs {
			total += counter(t, r.reg, name, nil)
		}
		return total
	}
	testenv.Eventually(t, 15*time.Second, "three members, every key written", func() bool {
		for _, r := range rs {
			if len(r.w.Fleet().Members) != 3 {
				return false
			}
		}
		return priv.Exists(ctx, keys...).Val() == n
	})
	ok0 := sum("keepwarm_warmer_refreshes_total")
	testenv.Eventually(t, 20*time.Second, "two more refresh rounds", func() bool {
		return sum("keepwarm_warmer_refreshes_total") >= ok0+2*n
	})
	// Misses before the outage (a loaded machine can delay a refresh past a 3 s TTL) are not this test's.
	obs := observe(t, priv, keys...)
	before := sum("keepwarm_warmer_hot_expired_total")
	// Every key's TTL is at most 3 s (ttl, no jitter) when Redis stops; 5 s later each has expired once.
	var app *redis.Client
	if appsRebuild {
		app = redis.NewClient(opt)
		t.Cleanup(func() { app.Close() })
		if err := app.Ping(ctx).Err(); err != nil { // connected before the freeze
			t.Fatal(err)
		}
	}
	frz.Freeze(t)
	var apps sync.WaitGroup
	if appsRebuild {
		// Sent while Redis is frozen: they run as it thaws, before the replicas' first readings.
		for _, k := range keys {
			apps.Add(1)
			go func() {
				defer apps.Done()
				app.Set(ctx, k, "rebuilt by an app", 3*time.Second) // the keyspace's ttl, as an app's lockstep client writes
			}()
		}
	}
	time.Sleep(5 * time.Second) // the outage itself, not a wait for a result
	frz.Thaw(t)
	thawed := time.Now()
	apps.Wait()
	if !testenv.Poll(20*time.Second, func() bool {
		for _, r := range rs {
			if len(r.w.Fleet().Members) != 3 {
				return false
			}
		}
		return priv.Exists(ctx, keys...).Val() == n && sum("keepwarm_warmer_hot_expired_total")-before >= n
	}) {
		s := fmt.Sprintf("keys present %d of %d, counted %v, seen twice %v;", priv.Exists(ctx, keys...).Val(), n,
			sum("keepwarm_warmer_hot_expired_total"), sum("keepwarm_warmer_fleet_misses_deduplicated_total"))
		for _, r := range rs {
			s += fmt.Sprintf(" %s: counted %v, owned %d, members %s;", r.id,
				counter(t, r.reg, "keepwarm_warmer_hot_expired_total", nil), owned(r.w), members(r.w))
		}
		t.Fatalf("every key rebuilt and counted, three members again: not within 20 s: %s", s)
	}
	// Two more refresh rounds: a late second count of any key would have come by then.
	ok1 := sum("keepwarm_warmer_refreshes_total")
	testenv.Eventually(t, 20*time.Second, "two more refresh rounds", func() bool {
		return sum("keepwarm_warmer_refreshes_total") >= ok1+2*n
	})
	obs.stop()
	// Any gap that starts once the fleet is back is another miss (a refresh late on a loaded machine), to be
	// counted as well; the outage's own gaps start before the thaw, or at the observer's first poll after it.
	later := 0
	for _, g := range obs.all() {
		if g.start.After(thawed.Add(time.Second)) {
			later++
		}
	}
	got, dup := sum("keepwarm_warmer_hot_expired_total")-before, sum("keepwarm_warmer_fleet_misses_deduplicated_total")
	if got != float64(n+later) {
		t.Errorf("the fleet counted %v misses since the outage; want %d: %d keys that each expired once in it, and %d later gaps the observer saw (%v more seen twice and not counted again)",
			got, n+later, n, later, dup)
	} else {
		t.Logf("%d misses counted once each (%d after the outage); %v more seen by a second replica and not counted again", n+later, later, dup)
	}
}

// A key lost again after its rebuild is a second miss, also in a fleet, where each miss is claimed in Redis
// before it counts (missclaim.go). The claim of the first loss is dated when it was counted; the rebuild that
// followed is dated when its publish was sent, which is earlier when that publish found the key gone, or a few
// milliseconds later when the batch's re-check did: within the claim's 250 ms margin, so the next loss of that
// value read as the one counted already, and was only logged as "already counted by another replica" (a soak: track:3384
// missing 12.6 s in a Redis pause, counted by no replica, 21 s after its previous miss).
func TestEachLossOfAKeyCountedInAFleet(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	ctx := context.Background()
	long := func(cfg *warmer.KeyspaceConfig) { cfg.TTL, cfg.RefreshAhead = 4*time.Second, 2*time.Second }
	r := startLeaseReplica(t, f, testenv.Redis(t), "a", []string{"1"}, long)
	key := f.key("1")
	testenv.Eventually(t, 10*time.Second, "the key written", func() bool { return f.rdb.Exists(ctx, key).Val() == 1 })
	const losses = 3
	for i := 1; i <= losses; i++ {
		// Each loss after the daemon has rewritten the key: a new value, and a new miss when it goes.
		testenv.Eventually(t, 10*time.Second, "the key rebuilt", func() bool {
			return f.rdb.Exists(ctx, key).Val() == 1 && sloMisses(t, r.reg)+counter(t, r.reg, "keepwarm_warmer_fleet_misses_deduplicated_total", nil) >= float64(i-1)
		})
		time.Sleep(300 * time.Millisecond) // past its write: the daemon knows the value (its expiry) before it goes
		if err := f.rdb.PExpire(ctx, key, time.Millisecond).Err(); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, "the loss judged", func() bool {
			return sloMisses(t, r.reg)+counter(t, r.reg, "keepwarm_warmer_fleet_misses_deduplicated_total", nil) >= float64(i)
		})
	}
	if got, dup := sloMisses(t, r.reg), counter(t, r.reg, "keepwarm_warmer_fleet_misses_deduplicated_total", nil); got != losses || dup != 0 {
		t.Errorf("SLO counter %v, %v deduplicated, for %d losses of the key; want %d and 0", got, dup, losses, losses)
	}
}
