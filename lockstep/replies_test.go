package lockstep_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
)

// A publish that gets an error reply (here WRONGTYPE: the meta key is not a hash) writes nothing at all and leaves
// the lock held by the caller's token, so that the caller can release it at once (issue: a failed publish must
// not orphan its lock, nor leave half a write behind).
func TestPublishErrorReplyWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, rdb), true)
	ks := mustFor(t, keys, "1")
	tok := lockstep.NewToken()
	rdb.Set(ctx, ks.Cache, "old", time.Minute)
	rdb.Set(ctx, ks.Meta, "not-a-hash", time.Minute)
	if ok, err := lockstep.Acquire(ctx, rdb, ks.Lock, tok, time.Minute); !ok || err != nil {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	res, err := lockstep.PublishMany(ctx, rdb, []lockstep.Write{{Keys: ks, Token: tok, Value: []byte("new"), TTL: time.Minute, StaleTTL: time.Hour}})
	if err != nil {
		t.Fatalf("PublishMany: transport error %v, want a per-write error reply", err)
	}
	if e := res[0].Err; e == nil || errors.Is(e, lockstep.ErrLockLost) || !strings.Contains(e.Error(), "WRONGTYPE") {
		t.Fatalf("PublishMany result = %v, want a WRONGTYPE error reply (not lock lost)", e)
	}
	if err := lockstep.Publish(ctx, rdb, lockstep.Write{Keys: ks, Token: tok, Value: []byte("new"), TTL: time.Minute}); err == nil ||
		!strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("Publish = %v, want WRONGTYPE", err)
	}
	if got := rdb.Get(ctx, ks.Cache).Val(); got != "old" {
		t.Errorf("cache = %q after a failed publish, want the old value untouched", got)
	}
	if n := rdb.Exists(ctx, ks.Stale).Val(); n != 0 {
		t.Errorf("stale copy written by a failed publish")
	}
	if got := rdb.Get(ctx, ks.Lock).Val(); got != tok {
		t.Fatalf("lock = %q after a failed publish, want still ours (%q) for the caller to release", got, tok)
	}
	if ok, err := lockstep.Release(ctx, rdb, ks.Lock, tok); !ok || err != nil {
		t.Errorf("Release = %v, %v", ok, err)
	}
}

// The publish reports the cache key's TTL just before the write, so a writer learns whether the value it
// replaced had already expired; and a lock that vanished (invalidated, evicted) is ErrLockGone, which is also
// ErrLockLost.
func TestPublishReportsPreviousTTLAndLockGone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, rdb), false)
	live, gone, inval := mustFor(t, keys, "live"), mustFor(t, keys, "gone"), mustFor(t, keys, "inval")
	tok := lockstep.NewToken()
	if _, err := lockstep.AcquireMany(ctx, rdb, []string{live.Lock, gone.Lock, inval.Lock}, tok, time.Minute); err != nil {
		t.Fatal(err)
	}
	rdb.Set(ctx, live.Cache, "old", 30*time.Second)
	rdb.Set(ctx, inval.Cache, "old", 30*time.Second)
	if err := lockstep.Invalidate(ctx, rdb, inval); err != nil {
		t.Fatal(err)
	}
	res, err := lockstep.PublishMany(ctx, rdb, []lockstep.Write{
		{Keys: live, Token: tok, Value: []byte("new"), TTL: time.Minute},
		{Keys: gone, Token: tok, Value: []byte("new"), TTL: time.Minute},
		{Keys: inval, Token: tok, Value: []byte("stale row"), TTL: time.Minute},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Err != nil || !res[0].Existed() || res[0].PrevTTL <= 20*time.Second || res[0].PrevTTL > 30*time.Second {
		t.Errorf("live: %+v, want written over a value with about 30s left", res[0])
	}
	if res[1].Err != nil || res[1].Existed() || res[1].PrevTTL != lockstep.PrevGone {
		t.Errorf("gone: %+v, want written, PrevTTL = PrevGone", res[1])
	}
	if !errors.Is(res[2].Err, lockstep.ErrLockGone) || !errors.Is(res[2].Err, lockstep.ErrLockLost) {
		t.Errorf("invalidated: err = %v, want ErrLockGone (matching ErrLockLost)", res[2].Err)
	}
	if n := rdb.Exists(ctx, inval.Cache, inval.Meta, inval.Lock).Val(); n != 0 {
		t.Errorf("invalidated key: %d of cache, meta, lock exist after the late publish, want 0", n)
	}
}

// Two processes (two tokens, two connections) keep one value alive with the fail-safe: max_stale is one bound
// for both, because the start of staleness lives in the meta hash (before, each started its own clock from an
// expiry the other had already extended, and the value outlived max_stale by up to one more max_stale).
func TestExtendValueManyFleetWideMaxStale(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := testenv.Redis(t), testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, a), false)
	ks := mustFor(t, keys, "1")
	a.Set(ctx, ks.Cache, "v", 2*time.Second)
	a.HSet(ctx, ks.Meta, lockstep.MetaDeltaField, "5")
	a.PExpire(ctx, ks.Meta, 2*time.Second)
	const maxStale = 3 * time.Second
	extend := func(rdbName string) lockstep.Extended {
		t.Helper()
		rdb := a
		if rdbName == "b" {
			rdb = b
		}
		tok := lockstep.NewToken()
		if ok, err := lockstep.Acquire(ctx, rdb, ks.Lock, tok, time.Minute); !ok || err != nil {
			t.Fatalf("%s: Acquire = %v, %v", rdbName, ok, err)
		}
		res, err := lockstep.ExtendValueMany(ctx, rdb, []lockstep.KeySet{ks}, tok, time.Hour, maxStale)
		if err != nil {
			t.Fatalf("%s: ExtendValueMany: %v", rdbName, err)
		}
		return res[0]
	}
	first := extend("a")
	if first.Err != nil || first.TTL > 5*time.Second || first.TTL < 4*time.Second {
		t.Fatalf("first extension = %+v, want about 2s left + 3s max_stale = 5s", first)
	}
	since, err := a.HGet(ctx, ks.Meta, lockstep.MetaStaleSinceField).Int64()
	if err != nil {
		t.Fatalf("meta %s: %v", lockstep.MetaStaleSinceField, err)
	}
	second := extend("b")
	if !errors.Is(second.Err, lockstep.ErrStaleLimit) {
		t.Fatalf("second process's extension = %+v, want ErrStaleLimit (the bound is shared)", second)
	}
	if pttl := a.PTTL(ctx, ks.Cache).Val(); pttl > first.TTL {
		t.Errorf("PTTL after the second process = %v, want ≤ %v", pttl, first.TTL)
	}
	if n := a.Exists(ctx, ks.Lock).Val(); n != 0 {
		t.Errorf("lock left behind by the fail-safe")
	}
	// A real publish ends staleness: the field is cleared, so the next outage gets a whole max_stale again.
	tok := lockstep.NewToken()
	if ok, _ := lockstep.Acquire(ctx, a, ks.Lock, tok, time.Minute); !ok {
		t.Fatal("Acquire failed")
	}
	if err := lockstep.Publish(ctx, a, lockstep.Write{Keys: ks, Token: tok, Value: []byte("fresh"), TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if n := a.HExists(ctx, ks.Meta, lockstep.MetaStaleSinceField).Val(); n {
		t.Errorf("%s = still set after a publish (was %d), want cleared", lockstep.MetaStaleSinceField, since)
	}
}

// Under maxmemory with noeviction every write is refused with OOM: AcquireMany reports the refused locks as
// ReplyErrors (not as a transport failure, not as "held elsewhere"), and a publish that is refused writes nothing.
func TestOOMReplies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.PrivateRedis(t)
	keys := mustKeys(t, "oom:", true)
	ks := mustFor(t, keys, "1")
	tok := lockstep.NewToken()
	if ok, err := lockstep.Acquire(ctx, rdb, ks.Lock, tok, time.Minute); !ok || err != nil {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	got, err := lockstep.AcquireMany(ctx, rdb, []string{"oom:lock:a", "oom:lock:b"}, tok, time.Minute)
	var replies lockstep.ReplyErrors
	if !errors.As(err, &replies) || len(replies) != 2 || !strings.HasPrefix(replies[0].Error(), "OOM") {
		t.Fatalf("AcquireMany under OOM = %v, %v; want ReplyErrors with two OOM replies", got, err)
	}
	if got == nil || got[0] || got[1] {
		t.Errorf("AcquireMany result = %v, want [false false]", got)
	}
	res, err := lockstep.PublishMany(ctx, rdb, []lockstep.Write{{Keys: ks, Token: tok, Value: []byte("v"), TTL: time.Minute, StaleTTL: time.Hour}})
	if err != nil || res[0].Err == nil || !strings.HasPrefix(res[0].Err.Error(), "OOM") {
		t.Fatalf("PublishMany under OOM = %v, %v; want an OOM reply", res, err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, ks.Cache, ks.Meta, ks.Stale).Val(); n != 0 {
		t.Errorf("%d keys written by a publish refused for OOM, want 0", n)
	}
	if got := rdb.Get(ctx, ks.Lock).Val(); got != tok {
		t.Errorf("lock = %q, want still ours after the refused publish", got)
	}
}

// The invalidate-on-write race through the read-through client: a leader's loader reads the old row, then another
// app process commits a change and invalidates the key. The leader's publish fails (the lock is gone) and the
// old row is never cached; the next Get loads the new row.
func TestInvalidateBeatsInflightClientRebuild(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, writer := testenv.Redis(t), testenv.Redis(t) // two app processes
	keys := mustKeys(t, testenv.Prefix(t, rdb), false)
	var row atomic.Value
	row.Store("old")
	var raced atomic.Bool
	c := newClient(t, rdb, "product", keys, func(context.Context, string) ([]byte, error) {
		v := row.Load().(string)
		if raced.CompareAndSwap(false, true) {
			// The write path runs between this read and the leader's publish.
			row.Store("new")
			w := newClient(t, writer, "product", keys, func(context.Context, string) ([]byte, error) { return nil, nil }, time.Minute)
			if err := w.Invalidate(ctx, "7"); err != nil {
				t.Error(err)
			}
		}
		return []byte(v), nil
	}, time.Minute)
	if v, err := c.Get(ctx, "7"); err != nil || string(v) != "old" {
		t.Fatalf("first Get = %q, %v; want the value it loaded (old)", v, err)
	}
	ks := mustFor(t, keys, "7")
	if n := rdb.Exists(ctx, ks.Cache).Val(); n != 0 {
		t.Fatalf("old row cached after an invalidation raced the rebuild: %q", rdb.Get(ctx, ks.Cache).Val())
	}
	if v, err := c.Get(ctx, "7"); err != nil || string(v) != "new" {
		t.Errorf("second Get = %q, %v; want the new row", v, err)
	}
}
