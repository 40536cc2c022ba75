package warmer

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
)

// A change's publish (the change stream refreshing a hot key) reports the TTL of the value it replaced: found
// gone, or rebuilt by an app after the expiry the daemon knew, the key was missed, as when a refresh's publish
// finds it so. And the new value re-arms the count: a key whose earlier miss was counted must count its next
// expiry too. Before, the change's publish only moved the expiry on: 0 of 2 counted in the first case, and in
// the last the second expiry went uncounted. Driven by hand on a keyspace that was never started (its messages
// run at once), with a fake clock and a real Redis.
func TestChangePublishJudgesTheValueItReplaced(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	ctx := context.Background()
	newKeyspace := func(t *testing.T, name string) (*keyspace, *clockwork.FakeClock, lockstep.KeySet) {
		k, clock, _, ks := handKeyspace(t, rdb, prefix, name)
		return k, clock, ks
	}
	// publish is a change's publish of id 1 at the clock's now that replaced a value with prev left.
	publish := func(k *keyspace, clock *clockwork.FakeClock, prev time.Duration) {
		p := &pipeline{start: clock.Now()}
		it := &item{id: "1", result: ResultOK, ttl: 10 * time.Second, prevTTL: prev}
		k.mail.Send(func(s *loopState) { noteRefreshedOn(s, p, []*item{it}) })
	}

	t.Run("found gone after its expiry", func(t *testing.T) {
		k, clock, _ := newKeyspace(t, "gone")
		clock.Advance(11 * time.Second)
		publish(k, clock, lockstep.PrevGone)
		if n := k.hotExpired.Load(); n != 1 {
			t.Errorf("counted %d, want 1", n)
		}
	})
	t.Run("an app's rebuild after its expiry", func(t *testing.T) {
		k, clock, _ := newKeyspace(t, "rebuilt")
		clock.Advance(11 * time.Second)
		publish(k, clock, 9500*time.Millisecond) // written 0.5 s ago, after the expiry at 10 s
		if n := k.hotExpired.Load(); n != 1 {
			t.Errorf("counted %d, want 1", n)
		}
	})
	t.Run("the daemon's own value before its expiry", func(t *testing.T) {
		k, clock, _ := newKeyspace(t, "fresh")
		clock.Advance(5 * time.Second)
		publish(k, clock, 5*time.Second)
		if n := k.hotExpired.Load(); n != 0 {
			t.Errorf("counted %d, want 0", n)
		}
	})
	t.Run("the next expiry after a counted miss", func(t *testing.T) {
		k, clock, ks := newKeyspace(t, "again")
		// Missed and counted: a reading after its expiry finds it gone.
		clock.Advance(11 * time.Second)
		rdb.Del(ctx, ks.Cache)
		k.mail.Send(func(s *loopState) {
			h := s.hotSet["1"]
			h.needPTTL = true
			s.adopt = append(s.adopt, h)
			s.learnExpiries(ctx)
		})
		if n := k.hotExpired.Load(); n != 1 {
			t.Fatalf("counted %d at the first miss, want 1", n)
		}
		// A change writes a new value (the key was gone: the miss counted already), which expires unrefreshed.
		publish(k, clock, lockstep.PrevGone)
		clock.Advance(11 * time.Second)
		k.mail.Send(func(s *loopState) {
			h := s.hotSet["1"]
			h.needPTTL = true
			s.adopt = append(s.adopt, h)
			s.learnExpiries(ctx) // the key is still gone in Redis: the change's value expired
		})
		if n := k.hotExpired.Load(); n != 2 {
			t.Errorf("counted %d after the change's value expired, want 2", n)
		}
	})
}
