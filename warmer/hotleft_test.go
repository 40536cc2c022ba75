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
		// Within expiryTolerance after it: the reading decides. Before, only keys leaving later than that were
		// read (seed 7201: track:53 left its owner's hot set 213 ms after its known expiry, missing 1.10 s).
		{"gone, left 100 ms after its expiry", 10*time.Second + 100*time.Millisecond, func(key string) { rdb.Del(ctx, key) }, 1, false},
		{"still there, left 100 ms after its expiry", 10*time.Second + 100*time.Millisecond, func(string) {}, 0, false},
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

// A key's OwnedSince in /debug/hotkeys is when this replica last came to own it while hot, not when it turned
// hot: the soak's observer judges a gap a hot key's by it. With HotSince, a key that turned hot on a replica
// while another owned it, and fell to it when that owner was killed, read as owned since it turned hot, and a gap
// that began before the kill, after the dead owner had let the key leave its hot set, failed the per-key check
// as its (kill -9 soak, seed 5004: track:2037, album:263, track:578). Driven by hand with fake time.
func TestOwnedSinceFollowsTheMemberList(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	k, clock, _, _ := handKeyspace(t, rdb, testenv.Prefix(t, rdb), "owned")
	other := otherOwner(t, "a", "1")
	status := func() KeyStatus {
		t.Helper()
		var st *KeyspaceStatus
		k.mail.Send(func(s *loopState) { st = s.snapshot(clock.Now()) })
		if len(st.Keys) != 1 {
			t.Fatalf("status lists %d keys, want id 1", len(st.Keys))
		}
		return st.Keys[0]
	}
	hotSince := clock.Now()
	if st := status(); !st.Owned || !st.OwnedSince.Equal(hotSince) || !st.HotSince.Equal(hotSince) {
		t.Fatalf("alone: owned %v since %v, hot since %v; want owned since it turned hot, %v", st.Owned, st.OwnedSince, st.HotSince, hotSince)
	}
	clock.Advance(time.Second)
	k.mail.Send(func(s *loopState) { s.applyView(testView("a", "a", other), time.Time{}) })
	if st := status(); st.Owned || !st.OwnedSince.IsZero() {
		t.Fatalf("%s owns it: owned %v since %v, want not owned, zero", other, st.Owned, st.OwnedSince)
	}
	clock.Advance(time.Second)
	gained := clock.Now()
	k.mail.Send(func(s *loopState) { s.applyView(testView("a", "a"), time.Time{}) })
	clock.Advance(time.Second)
	k.mail.Send(func(s *loopState) { s.applyView(testView("a", "a"), time.Time{}) }) // the same owners again
	if st := status(); !st.Owned || !st.OwnedSince.Equal(gained) || !st.HotSince.Equal(hotSince) {
		t.Fatalf("after %s left: owned %v since %v, hot since %v; want owned since %v, hot since %v", other, st.Owned, st.OwnedSince, st.HotSince, gained, hotSince)
	}
	// A lapsed heartbeat renewed: the others owned the key in between, so this replica owns it anew.
	clock.Advance(time.Second)
	renewed := clock.Now()
	k.mail.Send(func(s *loopState) { s.applyView(testView("a", "a"), renewed.Add(-500*time.Millisecond)) })
	if st := status(); !st.OwnedSince.Equal(renewed) {
		t.Fatalf("after a lapse: owned since %v, want %v", st.OwnedSince, renewed)
	}
	clock.Advance(time.Second)
	var left []LeftKey
	k.mail.Send(func(s *loopState) {
		s.setHot(map[string]bool{})
		left = s.snapshot(clock.Now()).Left
	})
	if len(left) != 1 || !left[0].Owned || !left[0].OwnedSince.Equal(renewed) || !left[0].HotSince.Equal(hotSince) {
		t.Errorf("left keys = %+v, want id 1 owned since %v, hot since %v", left, renewed, hotSince)
	}
}

// otherOwner returns a member that owns id in a fleet of self and it.
func otherOwner(t *testing.T, self, id string) string {
	t.Helper()
	for _, o := range []string{"b", "c", "d", "e", "f", "g", "h"} {
		if !testView(self, self, o).owns(id) {
			return o
		}
	}
	t.Fatalf("no second member found that owns id %s", id)
	return ""
}

// A key that leaves the hot set after Redis was emptied and before the flush canary notices it is counted when
// the canary does: it was hot and owned when its value was flushed, before the expiry the daemon knew, so its
// leaving (judged by that expiry, still ahead) did not count it, and the re-read of the hot set no longer holds
// it. After a Redis restart the first access-set poll ranks ids on a second of reads; a key at the top_n edge
// that left then was missed by nobody (soak seed 7002: track:694, 1.05 s). A key that left before the emptying,
// or owned by another replica, is not counted; one flush counts it once. Driven by hand with fake time.
func TestKeyLeavingAfterAFlushIsCounted(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	ctx := context.Background()
	tests := []struct {
		name       string
		leaveFirst bool // the key leaves before Redis is emptied
		notOwned   bool // another replica owns the key
		want       int64
	}{
		{"left after the emptying", false, false, 1},
		{"left before the emptying", true, false, 0},
		{"left owned by another replica", false, true, 0},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, clock, _, ks := handKeyspace(t, rdb, prefix, "f"+string(rune('a'+i)))
			if tt.notOwned {
				k.mail.Send(func(s *loopState) { s.applyView(testView("a", "a", otherOwner(t, "a", "1")), time.Time{}) })
			}
			leave := func() {
				k.mail.Send(func(s *loopState) { s.setHot(map[string]bool{}) })
			}
			clock.Advance(time.Second)
			if tt.leaveFirst {
				leave()
				clock.Advance(100 * time.Millisecond)
			}
			emptied := clock.Now() // the canary's last look at a full Redis
			clock.Advance(100 * time.Millisecond)
			if err := rdb.Del(ctx, ks.Cache).Err(); err != nil {
				t.Fatal(err)
			}
			clock.Advance(100 * time.Millisecond)
			if !tt.leaveFirst {
				leave()
			}
			if n := k.hotExpired.Load(); n != 0 {
				t.Fatalf("counted %d when the key left, 8 s before its known expiry", n)
			}
			clock.Advance(500 * time.Millisecond)
			for range 2 { // the canary noticed the flush; a second notice of the same one counts nothing more
				k.mail.Send(func(s *loopState) {
					s.rereadOwned("flush", emptied, clock.Now())
					s.learnExpiries(ctx)
				})
			}
			if n := k.hotExpired.Load(); n != tt.want {
				t.Errorf("counted %d misses, want %d", n, tt.want)
			}
		})
	}
}

// A key whose expiry its owner never learnt (newly hot: its first reading found it gone) that Redis then announces
// expired or evicted was missed while hot, not a cold start: it existed after it turned hot. A kill -9 test beside
// stress-ng saw album:90 turn hot on its owner 10 ms before it expired and miss for 330 ms, counted by nobody. A del
// is an invalidation, and a key no event names stays a cold start. Driven by hand with fake time, real Redis.
func TestNewHotKeyAnnouncedExpiredIsCounted(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	ctx := context.Background()
	for i, tt := range []struct {
		event string // announced after the first reading; "" for none
		want  int64
	}{{"expired", 1}, {"evicted", 1}, {"del", 0}, {"", 0}} {
		t.Run("event "+tt.event, func(t *testing.T) {
			k, clock, cfg, _ := handKeyspace(t, rdb, prefix, "n"+string(rune('a'+i)))
			two, err := cfg.Keys.For("2")
			if err != nil {
				t.Fatal(err)
			}
			if err := rdb.Set(ctx, two.Cache, "v", 10*time.Millisecond).Err(); err != nil {
				t.Fatal(err)
			}
			k.mail.Send(func(s *loopState) { s.setHot(map[string]bool{"1": true, "2": true}) })
			if err := rdb.Del(ctx, two.Cache).Err(); err != nil { // it expires before its owner reads it
				t.Fatal(err)
			}
			clock.Advance(10 * time.Millisecond)
			k.mail.Send(func(s *loopState) { s.learnExpiries(ctx) })
			if n := k.hotExpired.Load(); n != 0 {
				t.Fatalf("counted %d at the first reading, which found the key gone with no expiry known", n)
			}
			clock.Advance(5 * time.Millisecond)
			k.mail.Send(func(s *loopState) {
				if tt.event != "" {
					s.event(tt.event, "2", 1)
				}
				s.learnExpiries(ctx)
			})
			if n := k.hotExpired.Load(); n != tt.want {
				t.Errorf("counted %d misses, want %d", n, tt.want)
			}
		})
	}
}
