package lockstep_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/auth"

	"github.com/keepwarm/keepwarm/internal/redisserver"
	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
)

// nearRecorder is a countingRecorder that also counts the near cache's events.
type nearRecorder struct {
	*countingRecorder
	nearHits, bypasses, invalidations, bytes atomic.Int64
}

func newNearRecorder() *nearRecorder { return &nearRecorder{countingRecorder: newCountingRecorder()} }

func (r *nearRecorder) NearHit(string)              { r.nearHits.Add(1) }
func (r *nearRecorder) NearBypass(string)           { r.bypasses.Add(1) }
func (r *nearRecorder) NearInvalidation(string)     { r.invalidations.Add(1) }
func (r *nearRecorder) NearBytes(_ string, n int64) { r.bytes.Store(n) }

var _ lockstep.NearRecorder = (*nearRecorder)(nil)

// nearOpts is a near cache whose staleness bound is far beyond every wait of these tests, so only invalidation
// can make a reader see a change in time.
var nearOpts = lockstep.NearCache{MaxBytes: 1 << 20, MaxStaleness: time.Hour}

// waitNearUp waits until c's invalidation connection is up.
func waitNearUp(tb testing.TB, c *lockstep.Client) {
	tb.Helper()
	testenv.Eventually(tb, 5*time.Second, "near cache up", func() bool { return lockstep.NearUp(c) })
}

// nearReaders are several Clients (each with its own connection pool) reading one id with several goroutines
// each. Once a goroutine has read want it must never read anything else: a regression is an old value served
// after the change was seen.
type nearReaders struct {
	clients []*lockstep.Client
	recs    []*nearRecorder
	origin  *atomic.Pointer[string]
}

func newNearReaders(tb testing.TB, url string, keys *lockstep.Keys, origin *atomic.Pointer[string], n int) *nearReaders {
	tb.Helper()
	return newNearReadersOn(tb, func(i int) *redis.Client {
		if i%2 == 1 { // the app's protocol does not matter: half the Clients speak RESP2
			return redisFromURL(tb, url+"?protocol=2")
		}
		return redisFromURL(tb, url)
	}, keys, origin, n)
}

// newNearReadersOn is newNearReaders with the app's client of Client i made by rdb(i).
func newNearReadersOn(tb testing.TB, rdb func(i int) *redis.Client, keys *lockstep.Keys, origin *atomic.Pointer[string], n int) *nearReaders {
	tb.Helper()
	r := &nearReaders{origin: origin}
	load := func(_ context.Context, _ string) ([]byte, error) { return []byte(*origin.Load()), nil }
	for i := range n {
		rdb := rdb(i)
		rec := newNearRecorder()
		c := newClient(tb, rdb, "product", keys, load, time.Hour, lockstep.WithNearCache(nearOpts), lockstep.WithRecorder(rec))
		waitNearUp(tb, c)
		r.clients = append(r.clients, c)
		r.recs = append(r.recs, rec)
	}
	return r
}

// warm reads id until every Client serves it from memory.
func (r *nearReaders) warm(tb testing.TB, id, want string) {
	tb.Helper()
	for i, c := range r.clients {
		testenv.Eventually(tb, 5*time.Second, fmt.Sprintf("client %d serves %q from memory", i, want), func() bool {
			before := r.recs[i].nearHits.Load()
			v, err := c.Get(context.Background(), id)
			return err == nil && string(v) == want && r.recs[i].nearHits.Load() > before
		})
	}
}

// converge runs 4 goroutines per Client reading id until each has read want (within the test's bound), then
// 20 more reads each; it fails on a read of anything else after want was read, or on an error unless
// tolerateErrors (a restart fails the reads on the pool's dead connections).
func (r *nearReaders) converge(tb testing.TB, id, want string, within time.Duration, tolerateErrors bool) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var wg sync.WaitGroup
	var seen atomic.Int64
	errs := make(chan error, 4*len(r.clients))
	for i, c := range r.clients {
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				after := -1
				for after < 20 {
					if ctx.Err() != nil {
						errs <- fmt.Errorf("client %d goroutine %d: never read %q within %v", i, g, want, within)
						return
					}
					v, err := c.Get(ctx, id)
					switch {
					case err != nil && tolerateErrors:
						continue
					case err != nil:
						errs <- fmt.Errorf("client %d goroutine %d: Get: %v", i, g, err)
						return
					case string(v) == want:
						if after < 0 {
							seen.Add(1)
						}
						after++
					case after >= 0:
						errs <- fmt.Errorf("client %d goroutine %d: read %q after %q", i, g, v, want)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Error(err)
	}
	if got, want := seen.Load(), int64(4*len(r.clients)); got != want {
		tb.Errorf("goroutines that read the new value: got %d, want %d", got, want)
	}
}

func redisFromURL(tb testing.TB, url string) *redis.Client {
	tb.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		tb.Fatal(err)
	}
	c := redis.NewClient(opt)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// TestNearCacheInvalidation: after any writer changes a value held in memory (a daemon-style publish under the
// lock, an app's rebuild through another Client, a DEL, a FLUSHDB, a plain SET), readers of three Clients see the
// new value within 2s although the staleness bound is an hour, and never the old one after the new. It runs on a
// private server, database 3 (FLUSHDB must not touch other tests' keys; a non-zero database must work).
func TestNearCacheInvalidation(t *testing.T) {
	srv := testenv.RestartableRedis(t)
	url := strings.TrimSuffix(srv.URL, "/0") + "/3"
	writer := redisFromURL(t, url)
	tests := []struct {
		name   string
		change func(t *testing.T, keys *lockstep.Keys, id, v2 string)
	}{
		{"daemon publish", func(t *testing.T, keys *lockstep.Keys, id, v2 string) {
			ctx := context.Background()
			ks := mustFor(t, keys, id)
			token := lockstep.NewToken()
			if ok, err := lockstep.Acquire(ctx, writer, ks.Lock, token, 5*time.Second); err != nil || !ok {
				t.Fatalf("Acquire = %v, %v", ok, err)
			}
			if err := lockstep.Publish(ctx, writer, lockstep.Write{Keys: ks, Token: token, Value: []byte(v2), TTL: time.Hour}); err != nil {
				t.Fatalf("Publish: %v", err)
			}
		}},
		{"app rebuild", func(t *testing.T, keys *lockstep.Keys, id, v2 string) {
			ctx := context.Background()
			app := newClient(t, redisFromURL(t, url), "product", keys, func(context.Context, string) ([]byte, error) {
				return []byte(v2), nil
			}, time.Hour)
			if err := app.Invalidate(ctx, id); err != nil {
				t.Fatalf("Invalidate: %v", err)
			}
			v, err := app.Get(ctx, id)
			checkGet(t, v, err, v2, nil)
		}},
		{"DEL", func(t *testing.T, keys *lockstep.Keys, id, _ string) {
			if err := writer.Del(context.Background(), mustFor(t, keys, id).Cache).Err(); err != nil {
				t.Fatal(err)
			}
		}},
		{"FLUSHDB", func(t *testing.T, _ *lockstep.Keys, _, _ string) {
			if err := writer.FlushDB(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
		}},
		{"SET", func(t *testing.T, keys *lockstep.Keys, id, v2 string) {
			if err := writer.Set(context.Background(), mustFor(t, keys, id).Cache, v2, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys := mustKeys(t, fmt.Sprintf("near%d:", i), false)
			var origin atomic.Pointer[string]
			v1, v2 := "v1-"+tt.name, "v2-"+tt.name
			origin.Store(&v1)
			r := newNearReaders(t, url, keys, &origin, 3)
			r.warm(t, "1", v1)
			origin.Store(&v2)
			tt.change(t, keys, "1", v2)
			r.converge(t, "1", v2, 2*time.Second, false)
			var inval int64
			for _, rec := range r.recs {
				inval += rec.invalidations.Load()
			}
			if inval < 3 {
				t.Errorf("invalidations recorded: got %d, want ≥ 3 (one per Client)", inval)
			}
		})
	}
}

// TestNearCacheConnectionLoss: when the invalidation connection is killed (CLIENT KILL) or Redis restarts, the
// near cache is emptied and bypassed, a change made meanwhile is seen, and the cache comes back with the
// connection.
func TestNearCacheConnectionLoss(t *testing.T) {
	srv := testenv.RestartableRedis(t)
	writer := redisFromURL(t, srv.URL)
	tests := []struct {
		name string
		loss func(t *testing.T, r *nearReaders)
	}{
		{"CLIENT KILL", func(t *testing.T, r *nearReaders) {
			for _, c := range r.clients {
				id := lockstep.NearClientID(c)
				if err := writer.ClientKillByFilter(context.Background(), "ID", fmt.Sprint(id)).Err(); err != nil {
					t.Fatalf("CLIENT KILL ID %d: %v", id, err)
				}
			}
		}},
		{"restart", func(t *testing.T, _ *nearReaders) {
			if err := srv.Restart(context.Background()); err != nil {
				t.Fatalf("restart: %v", err)
			}
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys := mustKeys(t, fmt.Sprintf("nearloss%d:", i), false)
			var origin atomic.Pointer[string]
			v1, v2 := "v1", "v2"
			origin.Store(&v1)
			r := newNearReaders(t, srv.URL, keys, &origin, 3)
			r.warm(t, "1", v1)
			before := make([]int64, len(r.clients))
			for j, c := range r.clients {
				before[j] = lockstep.NearClientID(c)
			}
			tt.loss(t, r)
			origin.Store(&v2)
			if err := writer.Set(context.Background(), mustFor(t, keys, "1").Cache, v2, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			r.converge(t, "1", v2, 5*time.Second, tt.name == "restart")
			for j, c := range r.clients {
				testenv.Eventually(t, 5*time.Second, fmt.Sprintf("client %d reconnected", j), func() bool {
					id := lockstep.NearClientID(c)
					return lockstep.NearUp(c) && id != 0 && id != before[j]
				})
			}
			r.warm(t, "1", v2)
		})
	}
}

// TestNearCacheFollowsTheAppsServer: the app's client moves to another server (a proxy or DNS name now points at
// server B, and the app's connections to A are killed) while the invalidation connection, a pub/sub one, stays
// subscribed on A and would hear nothing of changes made on B. The probe (the app's client PUBLISHes to a channel
// only the invalidation connection subscribes to) finds no receiver on B: the near cache is emptied and bypassed,
// every reader sees B's value well within the hour of MaxStaleness, and the near cache comes back on a new
// connection to B. Without the probe the readers serve A's old value from memory and the test fails.
func TestNearCacheFollowsTheAppsServer(t *testing.T) {
	ctx := context.Background()
	a, err := redisserver.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	b, err := redisserver.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	onA, onB := redisFromURL(t, a.URL), redisFromURL(t, b.URL)
	var target atomic.Pointer[string] // the address the name "moving:6379" resolves to
	addrA := onA.Options().Addr
	target.Store(&addrA)
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, *target.Load())
	}
	keys := mustKeys(t, "nearmoved:", false)
	var origin atomic.Pointer[string]
	v1, v2 := "v1 on A", "v2 on B"
	origin.Store(&v1)
	r := newNearReadersOn(t, func(int) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: "moving:6379", Dialer: dial})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}, keys, &origin, 3)
	r.warm(t, "1", v1)

	addrB := onB.Options().Addr
	target.Store(&addrB)
	origin.Store(&v2)
	if err := onB.Set(ctx, mustFor(t, keys, "1").Cache, v2, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	// The app's connections (TYPE normal) leave A; the invalidation connections (TYPE pubsub) stay.
	if err := onA.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatalf("CLIENT KILL TYPE normal on A: %v", err)
	}
	r.converge(t, "1", v2, 5*time.Second, true)
	r.warm(t, "1", v2) // served from memory again: the near cache is back, on B (A never had v2)
}

// TestNearCacheRefetch: a value served from memory and then changed by another writer is read again in the
// background, with no Get in between, so that the next Get is a near hit of the new value; a value that was only
// fetched (never served from memory) is not, and the next Get of it goes to Redis.
func TestNearCacheRefetch(t *testing.T) {
	srv := testenv.RestartableRedis(t)
	writer := redisFromURL(t, srv.URL)
	ctx := context.Background()
	keys := mustKeys(t, "nearrefetch:", false)
	rec := newNearRecorder()
	c := newClient(t, redisFromURL(t, srv.URL), "product", keys, func(_ context.Context, id string) ([]byte, error) {
		return []byte("v1-" + id), nil
	}, time.Hour, lockstep.WithNearCache(nearOpts), lockstep.WithRecorder(rec))
	waitNearUp(t, c)
	get := func(id, want string) (nearHit bool) {
		t.Helper()
		before := rec.nearHits.Load()
		v, err := c.Get(ctx, id)
		checkGet(t, v, err, want, nil)
		return rec.nearHits.Load() > before
	}
	testenv.Eventually(t, 5*time.Second, "1 served from memory", func() bool { return get("1", "v1-1") })
	held := lockstep.NearBytes(c)
	testenv.Eventually(t, 5*time.Second, "2 held in memory, never served from it", func() bool {
		if get("2", "v1-2") {
			t.Fatal("a Get of 2 was a near hit before the check below")
		}
		return lockstep.NearBytes(c) > held
	})
	inval := rec.invalidations.Load()
	for _, id := range []string{"2", "1"} { // invalidations arrive in this order; refetches run in it
		if err := writer.Set(ctx, mustFor(t, keys, id).Cache, "v2-"+id, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 5*time.Second, "both invalidations applied", func() bool { return rec.invalidations.Load() >= inval+2 })
	testenv.Eventually(t, 5*time.Second, "1 refetched without a Get", func() bool { return lockstep.NearBytes(c) > 0 })
	if !get("1", "v2-1") {
		t.Errorf("first Get of 1 after the change: a Redis read, want a near hit (the refetch)")
	}
	if get("2", "v2-2") {
		t.Errorf("first Get of 2 after the change: a near hit, want a Redis read (2 was never served from memory)")
	}
}

// TestNearCacheBypassWhileDown: a Client whose invalidation connection cannot be made (the server is gone) reads
// Redis on every Get and counts bypasses; nothing is served from memory.
func TestNearCacheBypassWhileDown(t *testing.T) {
	srv, err := redisserver.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	rdb := redisFromURL(t, srv.URL)
	keys := mustKeys(t, "nearbypass:", false)
	rec := newNearRecorder()
	var loads atomic.Int64
	c := newClient(t, rdb, "product", keys, func(context.Context, string) ([]byte, error) {
		loads.Add(1)
		return []byte("v"), nil
	}, time.Hour, lockstep.WithNearCache(nearOpts), lockstep.WithRecorder(rec))
	waitNearUp(t, c)
	if _, err := c.Get(context.Background(), "1"); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	testenv.Eventually(t, 5*time.Second, "near cache down", func() bool { return !lockstep.NearUp(c) })
	if got := lockstep.NearBytes(c); got != 0 {
		t.Errorf("bytes held while down: got %d, want 0", got)
	}
	hits := rec.nearHits.Load()
	if _, err := c.Get(context.Background(), "1"); err == nil {
		t.Errorf("Get with Redis gone: got no error, want one (it must not be served from memory)")
	}
	if got := rec.nearHits.Load(); got != hits {
		t.Errorf("near hits while down: got %d more, want 0", got-hits)
	}
	if rec.bypasses.Load() == 0 {
		t.Errorf("bypasses: got 0, want > 0")
	}
}

// fakeClock is a clock for WithClock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// clockedNear is a Client with a near cache of MaxStaleness 10s (refetch off when noRefetch) on the shared Redis,
// its clock moved by hand, its key template's keys, and a counter of its Redis round trips.
func clockedNear(t *testing.T, noRefetch bool) (*lockstep.Client, *lockstep.Keys, *fakeClock, *tripCounter) {
	t.Helper()
	rdb := testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, rdb), false)
	h := &tripCounter{}
	rdb.AddHook(h)
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	c := newClient(t, rdb, "product", keys, func(context.Context, string) ([]byte, error) { return []byte("v"), nil },
		time.Hour, lockstep.WithClock(clock.Now), lockstep.WithNearCache(lockstep.NearCache{MaxBytes: 1 << 20, MaxStaleness: 10 * time.Second, NoRefetch: noRefetch}))
	waitNearUp(t, c)
	return c, keys, clock, h
}

// TestNearCacheMaxStaleness: a held value is served from memory until MaxStaleness has passed on the Client's
// clock, not a nanosecond longer, with no invalidation at all (NoRefetch: nothing renews it in the background).
func TestNearCacheMaxStaleness(t *testing.T) {
	c, _, clock, h := clockedNear(t, true)
	ctx := context.Background()
	get := func() int64 {
		t.Helper()
		before := h.n.Load()
		v, err := c.Get(ctx, "1")
		checkGet(t, v, err, "v", nil)
		return h.n.Load() - before
	}
	// The rebuild's own publish is invalidated too (asynchronously): read until the value is held.
	testenv.Eventually(t, 5*time.Second, "value held", func() bool { return get() == 0 })
	steps := []struct {
		advance time.Duration
		want    int64 // round trips of the next Get
	}{
		{0, 0},
		{10*time.Second - time.Nanosecond, 0}, // the bound counts from the start of the read that fetched it
		{time.Nanosecond, 1},                  // at the bound: read again from Redis (and held again)
		{9 * time.Second, 0},
		{time.Second, 1},
	}
	for i, s := range steps {
		clock.Advance(s.advance)
		if got := get(); got != s.want {
			t.Errorf("step %d (+%v): round trips: got %d, want %d", i, s.advance, got, s.want)
		}
	}
}

// TestNearCacheRenewsBeforeItsBound: with the refetch on, a value served from memory is read again in the
// background once the last fifth of its life there begins, with no Get at that moment, so that a Get past the
// first value's bound is still served from memory (no round trip of its own); before that fifth, nothing is
// read again.
func TestNearCacheRenewsBeforeItsBound(t *testing.T) {
	c, keys, clock, h := clockedNear(t, false)
	ctx := context.Background()
	key := mustFor(t, keys, "1").Cache
	get := func() {
		t.Helper()
		v, err := c.Get(ctx, "1")
		checkGet(t, v, err, "v", nil)
	}
	testenv.Eventually(t, 5*time.Second, "value held", func() bool {
		get()
		return !lockstep.NearDeadline(c, key).IsZero()
	})
	first := lockstep.NearDeadline(c, key)
	clock.Advance(8*time.Second - time.Nanosecond) // 1ns before the last fifth
	before := h.n.Load()
	get()
	get()
	if got := h.n.Load() - before; got != 0 {
		t.Errorf("reads before the last fifth: %d round trips, want 0 (no refetch queued)", got)
	}
	clock.Advance(time.Nanosecond) // the last fifth begins; no Get until the renewal is seen
	testenv.Eventually(t, 5*time.Second, "the value renewed in the background", func() bool {
		return lockstep.NearDeadline(c, key).After(first)
	})
	clock.Advance(2 * time.Second) // past the first value's bound
	before = h.n.Load()
	get()
	if got := h.n.Load() - before; got != 0 {
		t.Errorf("a Get past the first value's bound: %d round trips, want 0 (served from the renewed value)", got)
	}
}

// TestNearCacheRefetchesARenewedValue: a value renewed in the background (served, then its last fifth began) and
// changed by another writer before any read of the renewal is read again too: the renewal inherits the warmth
// of the value it replaced. Before, the first read after such a change, in every instance, went to Redis.
func TestNearCacheRefetchesARenewedValue(t *testing.T) {
	c, keys, clock, h := clockedNear(t, false)
	ctx := context.Background()
	key := mustFor(t, keys, "1").Cache
	read := func() string {
		t.Helper()
		v, err := c.Get(ctx, "1")
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		return string(v)
	}
	testenv.Eventually(t, 5*time.Second, "value held", func() bool {
		read()
		return !lockstep.NearDeadline(c, key).IsZero()
	})
	read() // served from memory: worth renewing
	first := lockstep.NearDeadline(c, key)
	clock.Advance(8 * time.Second)
	testenv.Eventually(t, 5*time.Second, "the value renewed in the background", func() bool {
		return lockstep.NearDeadline(c, key).After(first)
	})
	renewed := lockstep.NearDeadline(c, key)
	clock.Advance(time.Second) // a refetch from now on has a later deadline than the renewal's
	writer := testenv.Redis(t)
	if err := writer.Set(ctx, key, "v2", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the change refetched with no Get", func() bool {
		return lockstep.NearDeadline(c, key).After(renewed)
	})
	before := h.n.Load()
	if got := read(); got != "v2" || h.n.Load() != before {
		t.Errorf("first Get after the change: %q with %d round trips, want \"v2\" from memory", got, h.n.Load()-before)
	}
}

// TestNearCacheMemoryBound: the bytes held stay within MaxBytes however many values are read, and a value larger
// than a sixteenth of MaxBytes is never held.
func TestNearCacheMemoryBound(t *testing.T) {
	rdb := testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, rdb), false)
	h := &tripCounter{}
	rdb.AddHook(h)
	const maxBytes = 16 * 2048
	val := strings.Repeat("x", 300)
	big := strings.Repeat("y", maxBytes/16)
	ctx := context.Background()
	// The values are written before the Client exists, so no invalidation of theirs reaches it.
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range 500 {
			p.Set(ctx, mustFor(t, keys, fmt.Sprint(i)).Cache, val, time.Hour)
		}
		p.Set(ctx, mustFor(t, keys, "big").Cache, big, time.Hour)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, rdb, "product", keys, func(_ context.Context, id string) ([]byte, error) {
		if id == "big" {
			return []byte(big), nil
		}
		return []byte(val), nil
	}, time.Hour, lockstep.WithNearCache(lockstep.NearCache{MaxBytes: maxBytes, MaxStaleness: time.Hour}))
	waitNearUp(t, c)
	for i := range 500 {
		for range 2 { // read from Redis and held, then from memory
			if _, err := c.Get(ctx, fmt.Sprint(i)); err != nil {
				t.Fatal(err)
			}
		}
		if got := lockstep.NearBytes(c); got > maxBytes {
			t.Fatalf("after %d values: bytes held %d, want ≤ %d", i+1, got, maxBytes)
		}
	}
	if got := lockstep.NearBytes(c); got < maxBytes/2 {
		t.Errorf("bytes held after 500 values: got %d, want ≥ %d (the cache should fill)", got, maxBytes/2)
	}
	// The most recent value is still held.
	before := h.n.Load()
	if _, err := c.Get(ctx, "499"); err != nil {
		t.Fatal(err)
	}
	if got := h.n.Load() - before; got != 0 {
		t.Errorf("round trips for the most recent value: got %d, want 0", got)
	}
	for range 3 {
		if _, err := c.Get(ctx, "big"); err != nil {
			t.Fatal(err)
		}
	}
	before = h.n.Load()
	if _, err := c.Get(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	if got := h.n.Load() - before; got != 1 {
		t.Errorf("round trips for a value above MaxBytes/16: got %d, want 1 (never held)", got)
	}
}

// TestNearCacheAccessRecording: reads served from memory still feed the access sorted set.
func TestNearCacheAccessRecording(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	keys := mustKeys(t, prefix, false)
	keyspace := strings.TrimSuffix(prefix, ":") + "-near"
	rec := newNearRecorder()
	c, err := lockstep.New(rdb, keyspace, keys, func(context.Context, string) ([]byte, error) { return []byte("v"), nil },
		time.Hour, lockstep.WithNearCache(nearOpts), lockstep.WithRecorder(rec), lockstep.WithAccessRecording(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Del(context.Background(), lockstep.AccessKey(keyspace)) })
	waitNearUp(t, c)
	ctx := context.Background()
	for range 10 {
		if _, err := c.Get(ctx, "1"); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if rec.nearHits.Load() == 0 {
		t.Fatalf("near hits: got 0, want > 0")
	}
	got, err := rdb.ZScore(ctx, lockstep.AccessKey(keyspace), "1").Result()
	if err != nil || got != 10 {
		t.Errorf("access score = %v, %v; want 10 (every read, from memory or not)", got, err)
	}
}

// wrappedClient forwards to a *redis.Client, as an app's tracing wrapper would.
type wrappedClient struct{ *redis.Client }

// TestNearCacheRefused: set-ups the near cache cannot keep coherent, and bad fields, are errors at New.
func TestNearCacheRefused(t *testing.T) {
	keys := mustKeys(t, "nearrefused:", false)
	load := func(context.Context, string) ([]byte, error) { return nil, nil }
	plain := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = plain.Close() })
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() { _ = cluster.Close() })
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { _ = ring.Close() })
	provider := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", StreamingCredentialsProvider: staticStreamingCredentials{}})
	t.Cleanup(func() { _ = provider.Close() })
	tests := []struct {
		name    string
		rdb     lockstep.RedisClient
		opts    []lockstep.Option
		wantErr error
		wantMsg string
	}{
		{"cluster", cluster, nil, lockstep.ErrNearUnsupported, "*redis.ClusterClient"},
		{"ring", ring, nil, lockstep.ErrNearUnsupported, "*redis.Ring"},
		{"wrapper", wrappedClient{plain}, nil, lockstep.ErrNearUnsupported, "not a *redis.Client"},
		{"streaming credentials provider", provider, nil, lockstep.ErrNearUnsupported, "streaming provider"},
		{"xfetch", plain, []lockstep.Option{lockstep.WithXFetch(1)}, lockstep.ErrNearUnsupported, "XFetch"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := append([]lockstep.Option{lockstep.WithNearCache(nearOpts)}, tt.opts...)
			_, err := lockstep.New(tt.rdb, "product", keys, load, time.Hour, opts...)
			if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("New: got %v, want %v naming %q", err, tt.wantErr, tt.wantMsg)
			}
		})
	}
	bad := []struct {
		name string
		n    lockstep.NearCache
		want string
	}{
		{"max bytes", lockstep.NearCache{MaxStaleness: time.Second}, "max bytes"},
		{"max staleness", lockstep.NearCache{MaxBytes: 1}, "max staleness"},
		{"max lag negative", lockstep.NearCache{MaxBytes: 1, MaxStaleness: time.Second, MaxLag: -1}, "max lag"},
		{"max lag tiny", lockstep.NearCache{MaxBytes: 1, MaxStaleness: time.Second, MaxLag: time.Millisecond}, "max lag"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, err := lockstep.New(plain, "product", keys, load, time.Hour, lockstep.WithNearCache(tt.n))
			if !errors.Is(err, lockstep.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New: got %v, want ErrInvalidArgument naming %q", err, tt.want)
			}
		})
	}
}

// staticStreamingCredentials is an auth.StreamingCredentialsProvider that never changes its credentials.
type staticStreamingCredentials struct{}

func (staticStreamingCredentials) Subscribe(auth.CredentialsListener) (auth.Credentials, auth.UnsubscribeFunc, error) {
	return auth.NewBasicCredentials("u", "p"), func() error { return nil }, nil
}

// TestNearCacheCredentialsProvider: an app client that takes its credentials from a provider (no Username or
// Password in its options) gets a near cache whose tracking connection authenticates through the same provider,
// on a server whose default user is off; a change by another writer is seen through invalidation.
func TestNearCacheCredentialsProvider(t *testing.T) {
	srv, err := redisserver.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	ctx := context.Background()
	admin := redisFromURL(t, srv.URL)
	if err := admin.Do(ctx, "ACL", "SETUSER", "nearapp", "on", ">near-secret", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	opt, err := redis.ParseURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	writerOpt := *opt
	writerOpt.Username, writerOpt.Password = "nearapp", "near-secret"
	writer := redis.NewClient(&writerOpt)
	t.Cleanup(func() { _ = writer.Close() })
	if err := writer.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "ACL", "SETUSER", "default", "off").Err(); err != nil {
		t.Fatal(err)
	}
	var asked atomic.Int64
	appOpt := *opt
	appOpt.CredentialsProvider = func() (string, string) {
		asked.Add(1)
		return "nearapp", "near-secret"
	}
	rdb := redis.NewClient(&appOpt)
	t.Cleanup(func() { _ = rdb.Close() })
	keys := mustKeys(t, "nearcreds:", false)
	var origin atomic.Pointer[string]
	v1, v2 := "v1", "v2"
	origin.Store(&v1)
	rec := newNearRecorder()
	c := newClient(t, rdb, "product", keys, func(context.Context, string) ([]byte, error) { return []byte(*origin.Load()), nil },
		time.Hour, lockstep.WithNearCache(nearOpts), lockstep.WithRecorder(rec))
	waitNearUp(t, c)
	testenv.Eventually(t, 5*time.Second, "v1 served from memory", func() bool {
		before := rec.nearHits.Load()
		v, err := c.Get(ctx, "1")
		return err == nil && string(v) == v1 && rec.nearHits.Load() > before
	})
	origin.Store(&v2)
	if err := writer.Set(ctx, mustFor(t, keys, "1").Cache, v2, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Second, "v2 read after the writer's SET", func() bool {
		v, err := c.Get(ctx, "1")
		return err == nil && string(v) == v2
	})
	if got := asked.Load(); got < 2 {
		t.Errorf("provider calls: got %d, want ≥ 2 (the app's pool and the tracking connection)", got)
	}
}

// TestNearCacheRunsAppOnConnect: the tracking connection runs the app client's OnConnect too (here a CLIENT
// SETNAME), as every connection of the app does.
func TestNearCacheRunsAppOnConnect(t *testing.T) {
	base := testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, base), false)
	opt := *base.Options()
	opt.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		return cn.ClientSetName(ctx, "nearapp-onconnect").Err()
	}
	rdb := redis.NewClient(&opt)
	t.Cleanup(func() { _ = rdb.Close() })
	c := newClient(t, rdb, "product", keys, func(context.Context, string) ([]byte, error) { return []byte("v"), nil },
		time.Hour, lockstep.WithNearCache(nearOpts))
	waitNearUp(t, c)
	list, err := base.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("id=%d ", lockstep.NearClientID(c))
	for _, line := range strings.Split(list, "\n") {
		if strings.HasPrefix(line, want) {
			if !strings.Contains(line, " name=nearapp-onconnect ") {
				t.Errorf("tracking connection: got %q, want name=nearapp-onconnect", line)
			}
			return
		}
	}
	t.Errorf("CLIENT LIST has no %q", want)
}

// TestNearCacheInvalidateReadsOwnWrite: after Client.Invalidate returns, the same Client's next Get does not serve
// the old value from memory (it does not wait for Redis's invalidation to come back).
func TestNearCacheInvalidateReadsOwnWrite(t *testing.T) {
	rdb := testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, rdb), false)
	var origin atomic.Pointer[string]
	v := "v0"
	origin.Store(&v)
	rec := newNearRecorder()
	c := newClient(t, rdb, "product", keys, func(context.Context, string) ([]byte, error) { return []byte(*origin.Load()), nil },
		time.Hour, lockstep.WithNearCache(nearOpts), lockstep.WithRecorder(rec))
	waitNearUp(t, c)
	ctx := context.Background()
	for i := range 20 {
		held := *origin.Load()
		testenv.Eventually(t, 5*time.Second, held+" served from memory", func() bool {
			before := rec.nearHits.Load()
			got, err := c.Get(ctx, "1")
			return err == nil && string(got) == held && rec.nearHits.Load() > before
		})
		next := fmt.Sprintf("v%d", i+1)
		origin.Store(&next)
		if err := c.Invalidate(ctx, "1"); err != nil {
			t.Fatal(err)
		}
		got, err := c.Get(ctx, "1")
		checkGet(t, got, err, next, nil)
	}
}

// TestNearCacheLag: when the invalidation connection stops answering its heartbeat (the server is frozen, as a
// stalled host would be), the near cache is emptied and marked down within MaxLag, and comes back after.
func TestNearCacheLag(t *testing.T) {
	srv := testenv.PrivateFreezableRedis(t)
	rdb := redisFromURL(t, srv.URL)
	keys := mustKeys(t, "nearlag:", false)
	rec := newNearRecorder()
	c := newClient(t, rdb, "product", keys, func(context.Context, string) ([]byte, error) { return []byte("v"), nil },
		time.Hour, lockstep.WithRecorder(rec),
		lockstep.WithNearCache(lockstep.NearCache{MaxBytes: 1 << 20, MaxStaleness: time.Hour, MaxLag: 200 * time.Millisecond}))
	waitNearUp(t, c)
	ctx := context.Background()
	testenv.Eventually(t, 5*time.Second, "value held", func() bool {
		before := rec.nearHits.Load()
		_, err := c.Get(ctx, "1")
		return err == nil && rec.nearHits.Load() > before
	})
	srv.Freeze(t)
	testenv.Eventually(t, 5*time.Second, "near cache down while the server is frozen", func() bool { return !lockstep.NearUp(c) })
	if got := lockstep.NearBytes(c); got != 0 {
		t.Errorf("bytes held while down: got %d, want 0", got)
	}
	srv.Thaw(t)
	waitNearUp(t, c)
}
