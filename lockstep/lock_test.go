package lockstep_test

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/redis/go-redis/v9"
)

func TestNewToken(t *testing.T) {
	t.Parallel()
	re := regexp.MustCompile(`^[0-9a-f]{32}$`)
	seen := map[string]bool{}
	for range 1000 {
		tok := lockstep.NewToken()
		if !re.MatchString(tok) {
			t.Fatalf("NewToken() = %q, want 32 lowercase hex characters", tok)
		}
		if seen[tok] {
			t.Fatalf("NewToken() repeated %q", tok)
		}
		seen[tok] = true
	}
}

func TestAcquireReleaseExtend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	lock := testenv.Prefix(t, rdb) + "lock:product:1"
	mine, other := lockstep.NewToken(), lockstep.NewToken()

	ok, err := lockstep.Acquire(ctx, rdb, lock, mine, 10*time.Second)
	if err != nil || !ok {
		t.Fatalf("Acquire on a free lock = %v, %v; want true, nil", ok, err)
	}
	if got := rdb.Get(ctx, lock).Val(); got != mine {
		t.Fatalf("lock value = %q, want the token %q", got, mine)
	}
	if pttl := rdb.PTTL(ctx, lock).Val(); pttl <= 9*time.Second || pttl > 10*time.Second {
		t.Fatalf("lock PTTL = %v, want about 10s", pttl)
	}
	ok, err = lockstep.Acquire(ctx, rdb, lock, other, 10*time.Second)
	if err != nil || ok {
		t.Fatalf("Acquire on a held lock = %v, %v; want false, nil", ok, err)
	}

	// A wrong token changes nothing.
	ok, err = lockstep.Release(ctx, rdb, lock, other)
	if err != nil || ok {
		t.Fatalf("Release(wrong token) = %v, %v; want false, nil", ok, err)
	}
	ok, err = lockstep.Extend(ctx, rdb, lock, other, time.Hour)
	if err != nil || ok {
		t.Fatalf("Extend(wrong token) = %v, %v; want false, nil", ok, err)
	}
	if got := rdb.Get(ctx, lock).Val(); got != mine {
		t.Fatalf("after wrong-token calls, lock value = %q, want %q", got, mine)
	}
	if pttl := rdb.PTTL(ctx, lock).Val(); pttl > 10*time.Second {
		t.Fatalf("after Extend(wrong token), lock PTTL = %v, want ≤ 10s", pttl)
	}

	ok, err = lockstep.Extend(ctx, rdb, lock, mine, time.Hour)
	if err != nil || !ok {
		t.Fatalf("Extend(own token) = %v, %v; want true, nil", ok, err)
	}
	if pttl := rdb.PTTL(ctx, lock).Val(); pttl < 59*time.Minute {
		t.Fatalf("after Extend, lock PTTL = %v, want about 1h", pttl)
	}
	ok, err = lockstep.Release(ctx, rdb, lock, mine)
	if err != nil || !ok {
		t.Fatalf("Release(own token) = %v, %v; want true, nil", ok, err)
	}
	if n := rdb.Exists(ctx, lock).Val(); n != 0 {
		t.Fatalf("lock still exists after Release")
	}
	ok, err = lockstep.Release(ctx, rdb, lock, mine)
	if err != nil || ok {
		t.Fatalf("second Release = %v, %v; want false, nil", ok, err)
	}
	ok, err = lockstep.Extend(ctx, rdb, lock, mine, time.Hour)
	if err != nil || ok || rdb.Exists(ctx, lock).Val() != 0 {
		t.Fatalf("Extend of a released lock = %v, %v; want false, nil and no key", ok, err)
	}

	// Sub-millisecond TTLs round up rather than becoming PX 0 (an error in Redis).
	ok, err = lockstep.Acquire(ctx, rdb, lock, mine, time.Microsecond)
	if err != nil || !ok {
		t.Fatalf("Acquire(ttl 1µs) = %v, %v; want true, nil", ok, err)
	}
}

func TestLockBadArguments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	tests := []struct {
		name string
		call func() error
		want string
	}{
		{"acquire empty key", func() error { _, err := lockstep.Acquire(ctx, rdb, "", "t", time.Second); return err }, "lock key: empty"},
		{"acquire empty token", func() error { _, err := lockstep.Acquire(ctx, rdb, "k", "", time.Second); return err }, "token: empty"},
		{"acquire zero ttl", func() error { _, err := lockstep.Acquire(ctx, rdb, "k", "t", 0); return err }, "ttl: 0s is not > 0"},
		{"release empty key", func() error { _, err := lockstep.Release(ctx, rdb, "", "t"); return err }, "lock key: empty"},
		{"extend negative ttl", func() error { _, err := lockstep.Extend(ctx, rdb, "k", "t", -time.Second); return err }, "ttl: -1s is not > 0"},
		{"acquire many empty key", func() error {
			_, err := lockstep.AcquireMany(ctx, rdb, []string{"a", ""}, "t", time.Second)
			return err
		}, "lock keys[1]: lockstep: invalid argument: lock key: empty"},
		{"release many empty token", func() error { return lockstep.ReleaseMany(ctx, rdb, []string{"a"}, "") }, "token: empty"},
		{"extend many zero ttl", func() error { _, err := lockstep.ExtendMany(ctx, rdb, []string{"a"}, "t", 0); return err }, "ttl"},
		{"publish no cache key", func() error { return lockstep.Publish(ctx, rdb, lockstep.Write{Token: "t", TTL: time.Second}) }, "write: keys.cache: empty"},
		{"publish no token", func() error {
			return lockstep.Publish(ctx, rdb, lockstep.Write{Keys: lockstep.KeySet{Cache: "c", Lock: "l", Meta: "m"}, TTL: time.Second})
		}, "write: token: empty"},
		{"publish zero ttl", func() error {
			return lockstep.Publish(ctx, rdb, lockstep.Write{Keys: lockstep.KeySet{Cache: "c", Lock: "l", Meta: "m"}, Token: "t"})
		}, "write: ttl: 0s is not > 0"},
		{"publish negative stale ttl", func() error {
			return lockstep.Publish(ctx, rdb, lockstep.Write{Keys: lockstep.KeySet{Cache: "c", Lock: "l", Meta: "m"}, Token: "t", TTL: time.Second, StaleTTL: -1})
		}, "write: stale ttl"},
		{"publish many index", func() error {
			_, err := lockstep.PublishMany(ctx, rdb, []lockstep.Write{{Keys: lockstep.KeySet{Cache: "c", Lock: "l", Meta: "m"}, Token: "t", TTL: time.Second}, {}})
			return err
		}, "writes[1]: lockstep: invalid argument: write: keys.cache: empty"},
		{"extend value no meta", func() error {
			_, err := lockstep.ExtendValueMany(ctx, rdb, []lockstep.KeySet{{Cache: "c", Lock: "l"}}, "t", time.Second, time.Second)
			return err
		}, "keys[0]"},
		{"extend value no token", func() error {
			_, err := lockstep.ExtendValueMany(ctx, rdb, nil, "", time.Second, time.Second)
			return err
		}, "token: empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if !errors.Is(err, lockstep.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want ErrInvalidArgument containing %q", err, tt.want)
			}
		})
	}
}

func TestAcquireManyReleaseManyExtendMany(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	p := testenv.Prefix(t, rdb)
	keys := []string{p + "lock:a", p + "lock:b", p + "lock:c", p + "lock:a"}
	mine, other := lockstep.NewToken(), lockstep.NewToken()
	if err := rdb.Set(ctx, keys[1], other, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}

	got, err := lockstep.AcquireMany(ctx, rdb, keys, mine, 30*time.Second)
	if err != nil {
		t.Fatalf("AcquireMany: %v", err)
	}
	if want := []bool{true, false, true, false}; !slices.Equal(got, want) {
		t.Fatalf("AcquireMany = %v, want %v (b held by another token, a repeated)", got, want)
	}

	got, err = lockstep.ExtendMany(ctx, rdb, keys[:3], mine, time.Hour)
	if err != nil {
		t.Fatalf("ExtendMany: %v", err)
	}
	if want := []bool{true, false, true}; !slices.Equal(got, want) {
		t.Fatalf("ExtendMany = %v, want %v", got, want)
	}
	if pttl := rdb.PTTL(ctx, keys[0]).Val(); pttl < 59*time.Minute {
		t.Errorf("extended lock PTTL = %v, want about 1h", pttl)
	}
	if pttl := rdb.PTTL(ctx, keys[1]).Val(); pttl > time.Minute {
		t.Errorf("another token's lock PTTL = %v, want ≤ 1m (untouched)", pttl)
	}

	if err := lockstep.ReleaseMany(ctx, rdb, keys[:3], mine); err != nil {
		t.Fatalf("ReleaseMany: %v", err)
	}
	if n := rdb.Exists(ctx, keys[0], keys[2]).Val(); n != 0 {
		t.Errorf("%d of my locks survive ReleaseMany, want 0", n)
	}
	if v := rdb.Get(ctx, keys[1]).Val(); v != other {
		t.Errorf("another token's lock = %q after ReleaseMany, want %q", v, other)
	}

	// Empty batches make no round trip and return empty results.
	if got, err := lockstep.AcquireMany(ctx, rdb, nil, mine, time.Second); err != nil || len(got) != 0 {
		t.Errorf("AcquireMany(nil) = %v, %v", got, err)
	}
	if got, err := lockstep.ExtendMany(ctx, rdb, nil, mine, time.Second); err != nil || len(got) != 0 {
		t.Errorf("ExtendMany(nil) = %v, %v", got, err)
	}
	if err := lockstep.ReleaseMany(ctx, rdb, nil, mine); err != nil {
		t.Errorf("ReleaseMany(nil) = %v", err)
	}
}

func TestBatchTransportError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Nothing listens on port 1: every call must report the transport error, never a per-key result.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	ks := lockstep.KeySet{ID: "1", Cache: "c", Lock: "l", Meta: "m"}
	if _, err := lockstep.AcquireMany(ctx, rdb, []string{"l"}, "t", time.Second); err == nil {
		t.Error("AcquireMany: nil error, want a transport error")
	}
	if _, err := lockstep.PublishMany(ctx, rdb, []lockstep.Write{{Keys: ks, Token: "t", TTL: time.Second}}); err == nil {
		t.Error("PublishMany: nil error, want a transport error")
	}
	if _, err := lockstep.ExtendValueMany(ctx, rdb, []lockstep.KeySet{ks}, "t", time.Second, time.Second); err == nil {
		t.Error("ExtendValueMany: nil error, want a transport error")
	}
	if err := lockstep.Publish(ctx, rdb, lockstep.Write{Keys: ks, Token: "t", TTL: time.Second}); err == nil || errors.Is(err, lockstep.ErrLockLost) {
		t.Errorf("Publish = %v, want a transport error", err)
	}
}
