package lockstep_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/redis/go-redis/v9"
)

func acquire(tb testing.TB, rdb redis.UniversalClient, ks lockstep.KeySet, ttl time.Duration) string {
	tb.Helper()
	tok := lockstep.NewToken()
	ok, err := lockstep.Acquire(context.Background(), rdb, ks.Lock, tok, ttl)
	if err != nil || !ok {
		tb.Fatalf("Acquire(%s) = %v, %v", ks.Lock, ok, err)
	}
	return tok
}

func TestPublish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, rdb), true)
	ks := mustFor(t, keys, "7")
	value := []byte("\x00binary\xff{\"json\":true}\r\n") // stored exactly, no envelope

	before := time.Now()
	tok := acquire(t, rdb, ks, 5*time.Second)
	err := lockstep.Publish(ctx, rdb, lockstep.Write{Keys: ks, Token: tok, Value: value, TTL: 90 * time.Second,
		StaleTTL: time.Hour, Rebuild: 1234 * time.Millisecond})
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if got, _ := rdb.Get(ctx, ks.Cache).Bytes(); !bytes.Equal(got, value) {
		t.Errorf("cache = %q, want %q", got, value)
	}
	if got, _ := rdb.Get(ctx, ks.Stale).Bytes(); !bytes.Equal(got, value) {
		t.Errorf("stale = %q, want %q", got, value)
	}
	if pttl := rdb.PTTL(ctx, ks.Cache).Val(); pttl < 89*time.Second || pttl > 90*time.Second {
		t.Errorf("cache PTTL = %v, want about 90s", pttl)
	}
	if pttl := rdb.PTTL(ctx, ks.Meta).Val(); pttl < 89*time.Second || pttl > 90*time.Second {
		t.Errorf("meta PTTL = %v, want the cache TTL, about 90s", pttl)
	}
	if pttl := rdb.PTTL(ctx, ks.Stale).Val(); pttl < 59*time.Minute {
		t.Errorf("stale PTTL = %v, want about 1h", pttl)
	}
	meta := rdb.HGetAll(ctx, ks.Meta).Val()
	if meta[lockstep.MetaDeltaField] != "1234" {
		t.Errorf("meta %s = %q, want 1234", lockstep.MetaDeltaField, meta[lockstep.MetaDeltaField])
	}
	written, err := strconv.ParseInt(meta[lockstep.MetaWrittenField], 10, 64)
	if err != nil || written < before.Add(-2*time.Second).UnixMilli() || written > time.Now().Add(2*time.Second).UnixMilli() {
		t.Errorf("meta %s = %q, want the write time in Unix ms (about %d)", lockstep.MetaWrittenField, meta[lockstep.MetaWrittenField], before.UnixMilli())
	}
	if len(meta) != 2 {
		t.Errorf("meta = %v, want exactly the fields %s and %s", meta, lockstep.MetaWrittenField, lockstep.MetaDeltaField)
	}
	if rdb.Exists(ctx, ks.Lock).Val() != 0 {
		t.Errorf("lock survives Publish")
	}

	// StaleTTL 0 leaves the stale copy alone.
	tok = acquire(t, rdb, ks, 5*time.Second)
	if err := lockstep.Publish(ctx, rdb, lockstep.Write{Keys: ks, Token: tok, Value: []byte("v2"), TTL: time.Minute}); err != nil {
		t.Fatalf("Publish v2: %v", err)
	}
	if got := rdb.Get(ctx, ks.Stale).Val(); got != string(value) {
		t.Errorf("stale = %q after a write with StaleTTL 0, want it untouched", got)
	}
	if got := rdb.Get(ctx, ks.Cache).Val(); got != "v2" {
		t.Errorf("cache = %q, want v2", got)
	}

	// A token that does not hold the lock writes nothing.
	if err := lockstep.Publish(ctx, rdb, lockstep.Write{Keys: ks, Token: tok, Value: []byte("late"), TTL: time.Minute, StaleTTL: time.Hour}); !errors.Is(err, lockstep.ErrLockLost) {
		t.Fatalf("Publish without the lock = %v, want ErrLockLost", err)
	}
	if got := rdb.Get(ctx, ks.Cache).Val(); got != "v2" {
		t.Errorf("cache = %q after a lock-lost publish, want v2", got)
	}

	// Delete mode removes cache, meta and stale, under the token.
	if err := lockstep.Publish(ctx, rdb, lockstep.Write{Keys: ks, Token: tok, Delete: true}); !errors.Is(err, lockstep.ErrLockLost) {
		t.Fatalf("Delete without the lock = %v, want ErrLockLost", err)
	}
	if n := rdb.Exists(ctx, ks.Cache, ks.Meta, ks.Stale).Val(); n != 3 {
		t.Fatalf("%d of cache, meta, stale exist after a lock-lost delete, want 3", n)
	}
	tok = acquire(t, rdb, ks, 5*time.Second)
	if err := lockstep.Publish(ctx, rdb, lockstep.Write{Keys: ks, Token: tok, Delete: true}); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if n := rdb.Exists(ctx, ks.Cache, ks.Meta, ks.Stale, ks.Lock).Val(); n != 0 {
		t.Fatalf("%d of cache, meta, stale, lock exist after Delete, want 0", n)
	}
}

func TestPublishAfterLockExpired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	ks := mustFor(t, mustKeys(t, testenv.Prefix(t, rdb), false), "slow")

	first := acquire(t, rdb, ks, 30*time.Millisecond)
	waitGone(t, rdb, ks.Lock) // the first leader's rebuild outlives its lock
	second := acquire(t, rdb, ks, 5*time.Second)

	if err := lockstep.Publish(ctx, rdb, lockstep.Write{Keys: ks, Token: first, Value: []byte("old"), TTL: time.Minute}); !errors.Is(err, lockstep.ErrLockLost) {
		t.Fatalf("first leader's Publish = %v, want ErrLockLost", err)
	}
	if err := lockstep.Publish(ctx, rdb, lockstep.Write{Keys: ks, Token: second, Value: []byte("new"), TTL: time.Minute}); err != nil {
		t.Fatalf("second leader's Publish: %v", err)
	}
	if err := lockstep.Publish(ctx, rdb, lockstep.Write{Keys: ks, Token: first, Value: []byte("old"), TTL: time.Minute}); !errors.Is(err, lockstep.ErrLockLost) {
		t.Fatalf("first leader's late Publish = %v, want ErrLockLost", err)
	}
	if got := rdb.Get(ctx, ks.Cache).Val(); got != "new" {
		t.Fatalf("cache = %q, want the second leader's value", got)
	}
}

// waitGone polls until key no longer exists (a lock expiring on the server), failing after 5s.
func waitGone(tb testing.TB, rdb redis.UniversalClient, key string) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for rdb.Exists(context.Background(), key).Val() != 0 {
		if time.Now().After(deadline) {
			tb.Fatalf("%s did not expire", key)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestPublishMany(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, rdb), true)
	a, b, c, d := mustFor(t, keys, "a"), mustFor(t, keys, "b"), mustFor(t, keys, "c"), mustFor(t, keys, "d")
	tok := lockstep.NewToken()
	got, err := lockstep.AcquireMany(ctx, rdb, []string{a.Lock, c.Lock, d.Lock}, tok, 5*time.Second)
	if err != nil || !slices.Equal(got, []bool{true, true, true}) {
		t.Fatalf("AcquireMany = %v, %v", got, err)
	}
	// d already has a value that a Delete write will remove; b's lock belongs to someone else.
	rdb.Set(ctx, d.Cache, "gone", time.Minute)
	rdb.Set(ctx, d.Stale, "gone", time.Hour)
	rdb.Set(ctx, b.Lock, "someone-else", time.Minute)

	errs, err := lockstep.PublishMany(ctx, rdb, []lockstep.Write{
		{Keys: a, Token: tok, Value: []byte("A"), TTL: time.Minute, StaleTTL: time.Hour, Rebuild: 5 * time.Millisecond},
		{Keys: b, Token: tok, Value: []byte("B"), TTL: time.Minute},
		{Keys: c, Token: tok, Value: []byte("C"), TTL: time.Minute},
		{Keys: d, Token: tok, Delete: true},
	})
	if err != nil {
		t.Fatalf("PublishMany: %v", err)
	}
	want := []error{nil, lockstep.ErrLockLost, nil, nil}
	for i := range want {
		if !errors.Is(errs[i].Err, want[i]) || (want[i] == nil) != (errs[i].Err == nil) {
			t.Errorf("PublishMany result[%d] = %v, want %v", i, errs[i].Err, want[i])
		}
	}
	for key, want := range map[string]string{a.Cache: "A", a.Stale: "A", c.Cache: "C"} {
		if got := rdb.Get(ctx, key).Val(); got != want {
			t.Errorf("%s = %q, want %q", key, got, want)
		}
	}
	if n := rdb.Exists(ctx, b.Cache, c.Stale, d.Cache, d.Stale, d.Meta, a.Lock, c.Lock, d.Lock).Val(); n != 0 {
		t.Errorf("%d keys exist that PublishMany must not write or must delete, want 0", n)
	}
	if got := rdb.Get(ctx, b.Lock).Val(); got != "someone-else" {
		t.Errorf("b's lock = %q, want the other owner's", got)
	}
}

func TestExtendValueMany(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, rdb), false)
	held, gone, lost := mustFor(t, keys, "held"), mustFor(t, keys, "gone"), mustFor(t, keys, "lost")
	tok := lockstep.NewToken()
	if _, err := lockstep.AcquireMany(ctx, rdb, []string{held.Lock, gone.Lock}, tok, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	rdb.Set(ctx, held.Cache, "old", 2*time.Second)
	rdb.HSet(ctx, held.Meta, lockstep.MetaDeltaField, "10")
	rdb.PExpire(ctx, held.Meta, 2*time.Second)
	rdb.Set(ctx, lost.Cache, "theirs", 2*time.Second)
	rdb.Set(ctx, lost.Lock, "someone-else", time.Minute)

	errs, err := lockstep.ExtendValueMany(ctx, rdb, []lockstep.KeySet{held, gone, lost}, tok, 10*time.Minute, time.Hour)
	if err != nil {
		t.Fatalf("ExtendValueMany: %v", err)
	}
	for i, want := range []error{nil, lockstep.ErrNotFound, lockstep.ErrLockLost} {
		if errs[i].Err != want {
			t.Errorf("result[%d] = %v, want %v", i, errs[i].Err, want)
		}
	}
	if pttl := rdb.PTTL(ctx, held.Cache).Val(); pttl < 9*time.Minute {
		t.Errorf("held cache PTTL = %v, want about 10m", pttl)
	}
	if pttl := rdb.PTTL(ctx, held.Meta).Val(); pttl < 9*time.Minute {
		t.Errorf("held meta PTTL = %v, want about 10m", pttl)
	}
	if got := rdb.Get(ctx, held.Cache).Val(); got != "old" {
		t.Errorf("held cache = %q, want the old value kept", got)
	}
	if pttl := rdb.PTTL(ctx, lost.Cache).Val(); pttl > 2*time.Second {
		t.Errorf("lost cache PTTL = %v, want untouched (≤ 2s)", pttl)
	}
	if n := rdb.Exists(ctx, held.Lock, gone.Lock, gone.Cache).Val(); n != 0 {
		t.Errorf("%d of held lock, gone lock, gone cache exist, want 0 (locks released, nothing created)", n)
	}
	if got := rdb.Get(ctx, lost.Lock).Val(); got != "someone-else" {
		t.Errorf("lost lock = %q, want the other owner's", got)
	}
}
