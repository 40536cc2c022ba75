package lockstep_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
)

// TestExtendValueUnlockedUnderOOM: on a private Redis at maxmemory with noeviction, where SET NX of a lock is
// refused with OOM, ExtendValueUnlockedMany still extends values: to the wanted TTL, never past stale_since_ms +
// max_stale (kept, and for a value without meta hash created once, in the meta hash), never while a lock key
// exists, never shortening a TTL, and creating no key but that one meta hash (DBSIZE).
func TestExtendValueUnlockedUnderOOM(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.PrivateRedis(t)
	keys := mustKeys(t, "oom:", false)
	ks := func(id string) lockstep.KeySet { return mustFor(t, keys, id) }
	const life = time.Minute
	plain, withMeta, locked, bounded, long, gone, wrong := ks("plain"), ks("meta"), ks("locked"), ks("bounded"),
		ks("long"), ks("gone"), ks("wrongtype")
	for _, k := range []lockstep.KeySet{plain, withMeta, locked, bounded, wrong} {
		rdb.Set(ctx, k.Cache, "v-"+k.Cache, life)
	}
	rdb.Set(ctx, long.Cache, "v", 10*time.Minute)
	rdb.HSet(ctx, withMeta.Meta, lockstep.MetaWrittenField, "1", lockstep.MetaDeltaField, "5") // meta mode
	rdb.PExpire(ctx, withMeta.Meta, life)
	rdb.Set(ctx, locked.Lock, "an-apps-token", time.Minute)
	rdb.Set(ctx, wrong.Meta, "not a hash", time.Minute)
	testenv.FillToOOM(t, rdb)

	dbsize := func() int64 {
		t.Helper()
		n, err := rdb.DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	one := func(k lockstep.KeySet, want, maxStale time.Duration) lockstep.Extended {
		t.Helper()
		res, err := lockstep.ExtendValueUnlockedMany(ctx, rdb, []lockstep.KeySet{k}, want, maxStale)
		if err != nil {
			t.Fatalf("ExtendValueUnlockedMany(%s): %v", k.Cache, err)
		}
		return res[0]
	}
	at := func(key string) int64 { // PEXPIRETIME, Unix ms
		t.Helper()
		n, err := rdb.Do(ctx, "pexpiretime", key).Int64()
		if err != nil {
			t.Fatalf("PEXPIRETIME %s: %v", key, err)
		}
		return n
	}
	since := func(k lockstep.KeySet) int64 { return staleSince(t, rdb, []lockstep.KeySet{k})[0] }
	serverNow := func() int64 {
		t.Helper()
		tm, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMilli()
	}

	t.Run("no meta hash: extended, meta created once, no lock", func(t *testing.T) {
		orig, n0 := at(plain.Cache), dbsize()
		before := serverNow()
		r := one(plain, 2*life, time.Hour)
		if r.Err != nil || r.TTL <= life || r.TTL > 2*life {
			t.Fatalf("extension = %+v, want extended to (%v, %v]", r, life, 2*life)
		}
		if got := at(plain.Cache); got < before+(2*life).Milliseconds() || got > serverNow()+(2*life).Milliseconds() {
			t.Errorf("PEXPIRETIME = %d, want now + %v (now in [%d, %d])", got, 2*life, before, serverNow())
		}
		if got := since(plain); got != orig {
			t.Errorf("stale_since_ms = %d, want the value's own expiry %d", got, orig)
		}
		if got, want := at(plain.Meta), at(plain.Cache); got != want {
			t.Errorf("meta PEXPIRETIME = %d, want the cache key's %d", got, want)
		}
		if got := dbsize(); got != n0+1 {
			t.Errorf("DBSIZE = %d after the first extension, want %d + 1 (the meta hash holding the bound)", got, n0)
		}
		if n, _ := rdb.Exists(ctx, plain.Lock).Result(); n != 0 {
			t.Errorf("the extension left a lock key")
		}
		n1 := dbsize()
		if r := one(plain, 3*life, time.Hour); r.Err != nil || r.TTL <= 2*life {
			t.Fatalf("second extension = %+v, want extended past %v", r, 2*life)
		}
		if got := since(plain); got != orig {
			t.Errorf("stale_since_ms = %d after a second extension, want it kept at %d", got, orig)
		}
		if got := dbsize(); got != n1 {
			t.Errorf("DBSIZE = %d after a second extension, want %d: no new key", got, n1)
		}
		if mem, err := rdb.MemoryUsage(ctx, plain.Meta).Result(); err == nil {
			t.Logf("the meta hash holding the bound: MEMORY USAGE %d bytes", mem)
		}
	})

	t.Run("meta hash exists: extended, no new key", func(t *testing.T) {
		orig, n0 := at(withMeta.Cache), dbsize()
		if r := one(withMeta, 2*life, time.Hour); r.Err != nil || r.TTL <= life {
			t.Fatalf("extension = %+v, want extended past %v", r, life)
		}
		if got := dbsize(); got != n0 {
			t.Errorf("DBSIZE = %d, want %d: no new key", got, n0)
		}
		if got := since(withMeta); got != orig {
			t.Errorf("stale_since_ms = %d, want %d", got, orig)
		}
		if d, _ := rdb.HGet(ctx, withMeta.Meta, lockstep.MetaDeltaField).Result(); d != "5" {
			t.Errorf("delta_ms = %q, want the meta hash's own fields kept", d)
		}
		if got, want := at(withMeta.Meta), at(withMeta.Cache); got != want {
			t.Errorf("meta PEXPIRETIME = %d, want the cache key's %d", got, want)
		}
	})

	t.Run("lock held: nothing touched", func(t *testing.T) {
		orig, n0 := at(locked.Cache), dbsize()
		if r := one(locked, 2*life, time.Hour); !errors.Is(r.Err, lockstep.ErrLockHeld) {
			t.Fatalf("extension with a lock held = %+v, want ErrLockHeld", r)
		}
		if got := at(locked.Cache); got != orig {
			t.Errorf("PEXPIRETIME = %d, want %d untouched", got, orig)
		}
		if tok, _ := rdb.Get(ctx, locked.Lock).Result(); tok != "an-apps-token" {
			t.Errorf("lock = %q, want the app's token untouched", tok)
		}
		if got := dbsize(); got != n0 {
			t.Errorf("DBSIZE = %d, want %d", got, n0)
		}
	})

	t.Run("max_stale bound, exact, then stale limit", func(t *testing.T) {
		const maxStale = 5 * time.Second
		orig := at(bounded.Cache)
		bound := orig + maxStale.Milliseconds()
		if r := one(bounded, 10*life, maxStale); r.Err != nil {
			t.Fatalf("extension = %+v, want extended to the bound", r)
		}
		if got := at(bounded.Cache); got != bound {
			t.Errorf("PEXPIRETIME = %d, want exactly stale_since_ms + max_stale = %d", got, bound)
		}
		for i := range 3 { // every later call, by anyone, stops at the same bound
			r := one(bounded, 10*life, maxStale)
			if !errors.Is(r.Err, lockstep.ErrStaleLimit) || r.TTL <= 0 {
				t.Fatalf("call %d at the bound = %+v, want ErrStaleLimit with the TTL left", i, r)
			}
		}
		if got := at(bounded.Cache); got != bound {
			t.Errorf("PEXPIRETIME = %d after more calls, want %d", got, bound)
		}
	})

	t.Run("never shortens", func(t *testing.T) {
		orig := at(long.Cache)
		if r := one(long, time.Second, time.Hour); !errors.Is(r.Err, lockstep.ErrStaleLimit) || r.TTL < 9*time.Minute {
			t.Fatalf("extension to less than the TTL left = %+v, want ErrStaleLimit with the TTL left", r)
		}
		if got := at(long.Cache); got != orig {
			t.Errorf("PEXPIRETIME = %d, want %d untouched", got, orig)
		}
		if n, _ := rdb.Exists(ctx, long.Meta).Result(); n != 0 {
			t.Errorf("a meta hash was created for a value that was not extended")
		}
	})

	t.Run("gone", func(t *testing.T) {
		n0 := dbsize()
		if r := one(gone, life, time.Hour); !errors.Is(r.Err, lockstep.ErrNotFound) {
			t.Fatalf("extension of a missing key = %+v, want ErrNotFound", r)
		}
		if got := dbsize(); got != n0 {
			t.Errorf("DBSIZE = %d, want %d", got, n0)
		}
	})

	t.Run("wrong meta type: error before any write", func(t *testing.T) {
		orig := at(wrong.Cache)
		if r := one(wrong, 2*life, time.Hour); !redis.HasErrorPrefix(r.Err, "WRONGTYPE") {
			t.Fatalf("extension with a string meta key = %+v, want WRONGTYPE", r)
		}
		if got := at(wrong.Cache); got != orig {
			t.Errorf("PEXPIRETIME = %d, want %d untouched", got, orig)
		}
	})

	// Still refusing new keys at the end: every call above ran under OOM.
	if err := rdb.SetNX(ctx, "lock:oom-probe-2", "x", time.Second).Err(); !redis.HasErrorPrefix(err, "OOM") {
		t.Errorf("SET of a new key at the end: %v, want OOM (the test must run under OOM throughout)", err)
	}
}

// TestExtendValueUnlockedKeepsLockedBound: the unlocked and the locked fail-safe share one bound: a value that
// ExtendValueMany kept stale under a lock is not extended further by ExtendValueUnlockedMany than stale_since_ms +
// max_stale, and the start of staleness is not moved.
func TestExtendValueUnlockedKeepsLockedBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	k := mustFor(t, mustKeys(t, testenv.Prefix(t, rdb), false), "1")
	const maxStale = 2 * time.Second
	rdb.Set(ctx, k.Cache, "v", 500*time.Millisecond)
	orig := expireTimes(t, rdb, []lockstep.KeySet{k}, func(ks lockstep.KeySet) string { return ks.Cache })[0]
	token := lockstep.NewToken()
	if ok, err := lockstep.Acquire(ctx, rdb, k.Lock, token, time.Minute); !ok || err != nil {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	if res, err := lockstep.ExtendValueMany(ctx, rdb, []lockstep.KeySet{k}, token, time.Second, maxStale); err != nil || res[0].Err != nil {
		t.Fatalf("ExtendValueMany = %+v, %v", res, err)
	}
	res, err := lockstep.ExtendValueUnlockedMany(ctx, rdb, []lockstep.KeySet{k}, time.Hour, maxStale)
	if err != nil || res[0].Err != nil {
		t.Fatalf("ExtendValueUnlockedMany = %+v, %v", res, err)
	}
	if got := staleSince(t, rdb, []lockstep.KeySet{k})[0]; got != orig {
		t.Errorf("stale_since_ms = %d, want %d (set by the locked extension, kept)", got, orig)
	}
	if got := expireTimes(t, rdb, []lockstep.KeySet{k}, func(ks lockstep.KeySet) string { return ks.Cache })[0]; got != orig+maxStale.Milliseconds() {
		t.Errorf("PEXPIRETIME = %d, want exactly stale_since_ms + max_stale = %d", got, orig+maxStale.Milliseconds())
	}
}

// TestExtendValueUnlockedArguments: bad arguments are refused before anything is sent.
func TestExtendValueUnlockedArguments(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	k := mustFor(t, mustKeys(t, "args:", false), "1")
	for _, tc := range []struct {
		name          string
		keys          []lockstep.KeySet
		ttl, maxStale time.Duration
	}{
		{"zero ttl", []lockstep.KeySet{k}, 0, time.Second},
		{"negative max stale", []lockstep.KeySet{k}, time.Second, -time.Second},
		{"no meta key", []lockstep.KeySet{{Cache: k.Cache, Lock: k.Lock}}, time.Second, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := lockstep.ExtendValueUnlockedMany(context.Background(), rdb, tc.keys, tc.ttl, tc.maxStale); !errors.Is(err, lockstep.ErrInvalidArgument) {
				t.Errorf("got %v, want ErrInvalidArgument", err)
			}
		})
	}
}

// TestExtendValueUnderOOM: a lock taken before Redis filled up (maxmemory, noeviction) still lets its holder keep
// the value alive with ExtendValueMany: extend_value.lua's first write is PEXPIREAT, which Redis takes under OOM,
// and stale_since_ms is recorded (the bound) and the lock released. Before v4 its first write was the
// stale_since_ms HSET, which Redis refused: the origin's failure then let the value expire.
func TestExtendValueUnderOOM(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.PrivateRedis(t)
	keys := mustKeys(t, "oomlocked:", false)
	k := mustFor(t, keys, "1")
	const token = "the-daemons-token"
	rdb.Set(ctx, k.Cache, "v", time.Minute)
	if ok, err := lockstep.Acquire(ctx, rdb, k.Lock, token, time.Minute); err != nil || !ok {
		t.Fatalf("Acquire before the fill: %v %v", ok, err)
	}
	testenv.FillToOOM(t, rdb)
	res, err := lockstep.ExtendValueMany(ctx, rdb, []lockstep.KeySet{k}, token, 5*time.Minute, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if r := res[0]; r.Err != nil || r.TTL <= time.Minute {
		t.Fatalf("ExtendValueMany under OOM = %+v, want extended past its minute", r)
	}
	if since := staleSince(t, rdb, []lockstep.KeySet{k})[0]; since <= 0 {
		t.Errorf("stale_since_ms = %d, want the value's original expiry recorded", since)
	}
	if n := rdb.Exists(ctx, k.Lock).Val(); n != 0 {
		t.Errorf("the lock still exists after the extension")
	}
}
