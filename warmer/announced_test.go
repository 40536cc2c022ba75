package warmer

import (
	"context"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// A new value read within expiryTolerance of the known expiry is no miss by the reading alone: the daemon's
// expiry is an early estimate, and the value it knew may have been rewritten just before it really expired. When
// Redis announced that value expired (an "expired" keyevent heard at or after the known expiry), the new value
// is a rebuild after a miss (seed 7201: album:21, rebuilt by an app 134 ms after its expiry, read 231 ms after
// it, counted by nobody). An announcement heard well before the known expiry is not about that value. Driven by
// hand on a keyspace that was never started, with a fake clock and a real Redis.
func TestAnnouncedExpiryCountsARebuildWithinTolerance(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	ctx := context.Background()
	for i, tt := range []struct {
		name    string
		advance time.Duration // fake time from the first reading (a TTL of 10 s left) to the event
		event   string
		want    int64
	}{
		{"expired announced, rebuilt 100 ms after the expiry", 10*time.Second + 100*time.Millisecond, "expired", 1},
		{"not announced (a set event only)", 10*time.Second + 100*time.Millisecond, "set", 0},
		{"announced 3 s before the known expiry", 7 * time.Second, "expired", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			k, clock, _, ks := handKeyspace(t, rdb, prefix, "an"+string(rune('a'+i)))
			clock.Advance(tt.advance)
			if err := rdb.Set(ctx, ks.Cache, "app", 10*time.Second).Err(); err != nil {
				t.Fatal(err)
			}
			k.mail.Send(func(s *loopState) {
				s.event(tt.event, "1", 1)
				s.learnExpiries(ctx)
			})
			if n := k.hotExpired.Load(); n != tt.want {
				t.Errorf("counted %d misses, want %d", n, tt.want)
			}
		})
	}
}
