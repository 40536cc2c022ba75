package lockstep_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/redis/go-redis/v9"
)

// rawApp is an application that knows nothing of lockstep: it speaks only raw Redis commands, the common
// stampede-lock pattern written by hand. Its lock is `SET lock:<key> <uuid> NX EX <s>`, it releases with a
// compare-and-delete script, writes with a compare-token-then-SETEX-then-DEL script, and its followers poll the
// cache key and then fall back to stale:<key>. lockstep's default key layout must interoperate with it unchanged.
type rawApp struct {
	rdb    *redis.Client
	prefix string // the app's own key prefix, e.g. "kwtest:...:"; cache keys are <prefix>product:<id>
}

const (
	rawRelease = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`
	rawWrite   = `if redis.call("get", KEYS[1]) == ARGV[1] then
  redis.call("setex", KEYS[2], ARGV[3], ARGV[2])
  redis.call("setex", KEYS[3], ARGV[4], ARGV[2])
  redis.call("del", KEYS[1])
  return 1
end
return 0`
)

func uuid() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func (a rawApp) keys(id string) (cache, lock, stale string) {
	cache = a.prefix + "product:" + id
	return cache, "lock:" + cache, "stale:" + cache
}

// lead takes the lock and returns its token, or "" when someone else holds it.
func (a rawApp) lead(ctx context.Context, id string) (string, error) {
	_, lock, _ := a.keys(id)
	tok := uuid()
	err := a.rdb.Do(ctx, "SET", lock, tok, "NX", "EX", 5).Err()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return tok, err
}

// write stores value under the token; false when the lock no longer holds it.
func (a rawApp) write(ctx context.Context, id, tok string, value []byte) (bool, error) {
	cache, lock, stale := a.keys(id)
	n, err := a.rdb.Eval(ctx, rawWrite, []string{lock, cache, stale}, tok, value, 60, 3600).Int()
	return n == 1, err
}

// get is the app's read-through: GET; on a miss lead and load, or poll then fall back to the stale copy.
func (a rawApp) get(ctx context.Context, id string, load func() []byte) ([]byte, error) {
	cache, lock, stale := a.keys(id)
	if v, err := a.rdb.Do(ctx, "GET", cache).Text(); err == nil {
		return []byte(v), nil
	}
	tok, err := a.lead(ctx, id)
	if err != nil {
		return nil, err
	}
	if tok != "" {
		v := load()
		if ok, err := a.write(ctx, id, tok, v); err != nil || !ok {
			a.rdb.Eval(ctx, rawRelease, []string{lock}, tok)
		}
		return v, nil
	}
	for range 50 {
		time.Sleep(10 * time.Millisecond)
		if v, err := a.rdb.Do(ctx, "GET", cache).Text(); err == nil {
			return []byte(v), nil
		}
	}
	if v, err := a.rdb.Do(ctx, "GET", stale).Text(); err == nil {
		return []byte(v), nil
	}
	return nil, errors.New("raw app: timeout")
}

// TestRawAppCompatibility races raw-command apps against lockstep Clients on the same keys: there is never more
// than one rebuild at a time, and the value left in the cache is the newest one written.
func TestRawAppCompatibility(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const rounds, readersPerProc = 10, 25
	var inflight, maxInflight, version, rawLoads, lockstepLoads atomic.Int64
	load := func() []byte {
		n := inflight.Add(1)
		for {
			m := maxInflight.Load()
			if n <= m || maxInflight.CompareAndSwap(m, n) {
				break
			}
		}
		defer inflight.Add(-1)
		v := version.Add(1)
		time.Sleep(20 * time.Millisecond)
		return []byte("v" + strconv.FormatInt(v, 10))
	}
	first := testenv.Redis(t)
	prefix := testenv.Prefix(t, first)
	keys := mustKeys(t, prefix, true) // <prefix>product:${id}, lock:${key}, stale:${key}, meta:${key}
	raws := []rawApp{{first, prefix}, {testenv.Redis(t), prefix}}
	var clients []*lockstep.Client
	for range 2 {
		clients = append(clients, newClient(t, testenv.Redis(t), "product", keys,
			func(context.Context, string) ([]byte, error) { lockstepLoads.Add(1); return load(), nil }, time.Minute, lockstep.WithStale(time.Hour)))
	}
	for round := range rounds {
		id := "race-" + strconv.Itoa(round)
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, 4*readersPerProc)
		for g := range readersPerProc {
			for _, a := range raws {
				wg.Go(func() {
					<-start
					if _, err := a.get(ctx, id, func() []byte { rawLoads.Add(1); return load() }); err != nil {
						errs <- fmt.Errorf("raw reader %d: %w", g, err)
					}
				})
			}
			for _, c := range clients {
				wg.Go(func() {
					<-start
					if _, err := c.Get(ctx, id); err != nil {
						errs <- fmt.Errorf("lockstep reader %d: %w", g, err)
					}
				})
			}
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("round %d: %v", round, err)
		}
		cache, lock, _ := raws[0].keys(id)
		waitGone(t, first, lock)
		// Rebuilds are serialised by the lock and none loses it, so the newest loaded version must be the one left.
		if got, want := first.Get(ctx, cache).Val(), "v"+strconv.FormatInt(version.Load(), 10); got != want {
			t.Errorf("round %d: cache = %q, want the newest value %q", round, got, want)
		}
	}
	t.Logf("%d rounds: %d rebuilds by raw apps, %d by lockstep clients", rounds, rawLoads.Load(), lockstepLoads.Load())
	if m := maxInflight.Load(); m != 1 {
		t.Fatalf("saw %d rebuilds at once, want at most 1", m)
	}
}

// TestRawAppLockExpiry: whichever side's lock expires mid-rebuild, its late write is refused and the other side's
// newer value stays.
func TestRawAppLockExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	keys := mustKeys(t, prefix, true)
	raw := rawApp{testenv.Redis(t), prefix}
	c := newClient(t, rdb, "product", keys, func(_ context.Context, id string) ([]byte, error) { return []byte("from lockstep"), nil },
		time.Minute, lockstep.WithStale(time.Hour))

	t.Run("raw leader expires, lockstep publishes", func(t *testing.T) {
		tok, err := raw.lead(ctx, "a")
		if err != nil || tok == "" {
			t.Fatalf("raw lead = %q, %v", tok, err)
		}
		_, lock, _ := raw.keys("a")
		rdb.PExpire(ctx, lock, time.Millisecond) // the raw app's rebuild outlives its lock
		waitGone(t, rdb, lock)
		if v, err := c.Get(ctx, "a"); err != nil || string(v) != "from lockstep" {
			t.Fatalf("lockstep Get = %q, %v", v, err)
		}
		if ok, err := raw.write(ctx, "a", tok, []byte("stale raw")); err != nil || ok {
			t.Fatalf("raw late write = %v, %v; want refused", ok, err)
		}
		cache, _, _ := raw.keys("a")
		if got := rdb.Get(ctx, cache).Val(); got != "from lockstep" {
			t.Fatalf("cache = %q, want lockstep's newer value", got)
		}
	})

	t.Run("lockstep leader expires, raw app writes", func(t *testing.T) {
		ks := mustFor(t, keys, "b")
		tok := acquire(t, rdb, ks, 20*time.Millisecond)
		waitGone(t, rdb, ks.Lock)
		if v, err := raw.get(ctx, "b", func() []byte { return []byte("from raw") }); err != nil || string(v) != "from raw" {
			t.Fatalf("raw get = %q, %v", v, err)
		}
		err := lockstep.Publish(ctx, rdb, lockstep.Write{Keys: ks, Token: tok, Value: []byte("stale lockstep"), TTL: time.Minute, StaleTTL: time.Hour})
		if !errors.Is(err, lockstep.ErrLockLost) {
			t.Fatalf("lockstep late Publish = %v, want ErrLockLost", err)
		}
		if got := rdb.Get(ctx, ks.Cache).Val(); got != "from raw" {
			t.Fatalf("cache = %q, want the raw app's newer value", got)
		}
		// lockstep reads the raw app's value (no meta hash), with XFetch on too.
		xf := newClient(t, rdb, "product", keys, func(context.Context, string) ([]byte, error) { return nil, errors.New("must not load") },
			time.Minute, lockstep.WithXFetch(1), lockstep.WithRand(func() float64 { return 1 - 1e-300 }))
		if v, err := xf.Get(ctx, "b"); err != nil || string(v) != "from raw" {
			t.Fatalf("lockstep Get of a raw value = %q, %v", v, err)
		}
	})

	t.Run("each side's followers serve the other's stale copy", func(t *testing.T) {
		// lockstep wrote stale:<key> for "a"; the raw app's follower falls back to it while lockstep holds the lock.
		ks := mustFor(t, keys, "a")
		rdb.Del(ctx, ks.Cache)
		acquire(t, rdb, ks, time.Minute)
		if v, err := raw.get(ctx, "a", func() []byte { t.Error("raw follower loaded"); return nil }); err != nil || string(v) != "from lockstep" {
			t.Fatalf("raw follower = %q, %v; want lockstep's stale copy", v, err)
		}
		// The raw app wrote stale:<key> for "b"; a lockstep follower serves it while the raw app holds the lock.
		kb := mustFor(t, keys, "b")
		rdb.Del(ctx, kb.Cache)
		if tok, err := raw.lead(ctx, "b"); err != nil || tok == "" {
			t.Fatalf("raw lead = %q, %v", tok, err)
		}
		short := newClient(t, rdb, "product", keys, func(context.Context, string) ([]byte, error) { return nil, errors.New("must not load") },
			time.Minute, lockstep.WithWait(lockstep.Backoff{Total: 100 * time.Millisecond}))
		if v, err := short.Get(ctx, "b"); err != nil || string(v) != "from raw" {
			t.Fatalf("lockstep follower = %q, %v; want the raw app's stale copy", v, err)
		}
	})
}
