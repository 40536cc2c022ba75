package warmer

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
)

// A hot key that expires unrefreshed (Redis paused, so the daemon could neither refresh nor read it) and leaves
// the hot set before the daemon read it again (the first access-set poll after the pause, which saw no reads
// meanwhile) was missed while hot: the loop reads it once more and counts it, gone or rebuilt by someone else
// since. Before, it was dropped unjudged: a soak's Redis pause left gaps of 6–9 s on such keys that no replica
// counted. A key that leaves before its known expiry, or whose value was rewritten before that expiry, is not a
// miss. Driven by hand on a keyspace that was never started (its messages run at once), with a fake clock and a
// real Redis.
func TestKeyLeavingTheHotSetAfterItsExpiryIsJudged(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	ctx := context.Background()
	tests := []struct {
		name    string
		advance time.Duration // fake time from the first reading (a TTL of 10 s left) until the key leaves
		redis   func(key string)
		want    int64
		// inflight: a refresh of the key is in flight when it leaves (sent before a Redis pause, answered after
		// it); its result is dropped once the key has left, so the leaving judges it.
		inflight bool
	}{
		{"gone after its expiry", 11 * time.Second, func(key string) { rdb.Del(ctx, key) }, 1, false},
		{"rebuilt by an app after its expiry", 11 * time.Second, func(key string) { rdb.Set(ctx, key, "app", 10*time.Second) }, 1, false},
		{"rewritten before its expiry", 11 * time.Second, func(key string) { rdb.Set(ctx, key, "app", time.Second) }, 0, false},
		{"left before its expiry", 5 * time.Second, func(key string) { rdb.Del(ctx, key) }, 0, false},
		{"in flight, gone after its expiry", 11 * time.Second, func(key string) { rdb.Del(ctx, key) }, 1, true},
		{"in flight, rewritten before its expiry", 11 * time.Second, func(key string) { rdb.Set(ctx, key, "app", time.Second) }, 0, true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, clock, _, ks := handKeyspace(t, rdb, prefix, "k"+string(rune('a'+i)))
			if n := k.hotExpired.Load(); n != 0 {
				t.Fatalf("counted %d at the first reading", n)
			}
			clock.Advance(tt.advance)
			tt.redis(ks.Cache)
			k.mail.Send(func(s *loopState) {
				s.hotSet["1"].inflight = tt.inflight
				s.setHot(map[string]bool{})
				s.learnExpiries(ctx)
			})
			if n := k.hotExpired.Load(); n != tt.want {
				t.Errorf("counted %d misses, want %d", n, tt.want)
			}
			// The status names the key as left, with when it became hot and when it left.
			var left []LeftKey
			k.mail.Send(func(s *loopState) { left = s.snapshot(clock.Now()).Left })
			if len(left) != 1 || left[0].ID != "1" || !left[0].Owned || !left[0].LeftAt.Equal(clock.Now()) ||
				!left[0].HotSince.Equal(clock.Now().Add(-tt.advance)) {
				t.Errorf("status's left keys = %+v, want id 1, owned, hot since %v, left at %v", left, clock.Now().Add(-tt.advance), clock.Now())
			}
			clock.Advance(LeftKeep + time.Second)
			k.mail.Send(func(s *loopState) { left = s.snapshot(clock.Now()).Left })
			if len(left) != 0 {
				t.Errorf("status's left keys %v after LeftKeep, want none", left)
			}
		})
	}
}

// The left-keys log stays within leftMax however many keys leave, dropping the oldest, and keeps the latest.
func TestLeftKeysBounded(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	k, clock, _, _ := handKeyspace(t, rdb, testenv.Prefix(t, rdb), "left")
	k.mail.Send(func(s *loopState) {
		h := s.hotSet["1"]
		for range 3*leftMax + 7 {
			s.noteLeft(h, clock.Now(), true)
			clock.Advance(time.Millisecond)
		}
		if n := len(s.leftLog); n > leftMax || n < leftMax/2 {
			t.Errorf("%d keys in the left log, want between %d and %d", n, leftMax/2, leftMax)
		}
		if last := s.leftLog[len(s.leftLog)-1].LeftAt; !last.Equal(clock.Now().Add(-time.Millisecond)) {
			t.Errorf("the latest entry left at %v, want %v", last, clock.Now().Add(-time.Millisecond))
		}
	})
}

// handKeyspace returns keyspace "k" of a warmer that is never started (its messages run at once, in the caller's
// goroutine), on a fake clock and a real Redis, with keys under prefix+name, a TTL of 10 s and refresh-ahead of
// 2 s; id 1's value is written with a TTL of 10 s, made hot, and its expiry read: known, nothing judged.
func handKeyspace(t *testing.T, rdb *redis.Client, prefix, name string) (*keyspace, *clockwork.FakeClock, KeyspaceConfig, lockstep.KeySet) {
	t.Helper()
	ctx := context.Background()
	keys, err := lockstep.NewKeys(prefix+name+":${id}", "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	clock := clockwork.NewFakeClockAt(time.Now())
	cfg := KeyspaceConfig{Name: "k", Keys: keys, Src: nopSource{}, TTL: 10 * time.Second, RefreshAhead: 2 * time.Second,
		StatementTimeout: time.Second, PoolWaitTimeout: 500 * time.Millisecond, LockTTL: 5 * time.Second}
	w, err := New(rdb, Config{Keyspaces: []KeyspaceConfig{cfg}, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	k := w.keyspace("k")
	ks, _ := keys.For("1")
	if err := rdb.Set(ctx, ks.Cache, "v", 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	k.mail.Send(func(s *loopState) {
		s.setHot(map[string]bool{"1": true})
		s.learnExpiries(ctx)
	})
	return k, clock, cfg, ks
}
