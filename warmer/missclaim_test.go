package warmer

import (
	"context"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// TestMissClaimScript: the rule that makes a miss count in one replica, on a real Redis. A claim wins when no
// claim was seen at or after its threshold (the lost value's write, or two heartbeat TTLs before an undated
// miss), and the claim key keeps the latest date seen.
func TestMissClaimScript(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	key := testenv.Prefix(t, rdb) + "missed:items:1"
	ctx := context.Background()
	claim := func(threshold, seen int64) int64 {
		t.Helper()
		n, err := rdb.Eval(ctx, missClaimLua, []string{key}, threshold, seen, 60000).Int64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	steps := []struct {
		name             string
		threshold, seen  int64
		want, wantStored int64
	}{
		{"the first replica to see a miss counts it", 900, 1000, 1, 1000},
		{"another replica seeing the same value lost (written at 900) does not", 900, 1200, 0, 1000},
		{"the next value (written at 1100) lost: a new miss", 1100, 1300, 1, 1300},
		{"a late claim of an older miss counts nothing and keeps the newer date", 100, 200, 0, 1300},
		{"an undated miss (a takeover) within the window of the last one: the same", 1250, 1400, 0, 1300},
		{"an undated miss past the window: a new one", 1350, 1500, 1, 1500},
	}
	for _, s := range steps {
		if got := claim(s.threshold, s.seen); got != s.want {
			t.Errorf("%s: claim(threshold %d, seen %d) = %d, want %d", s.name, s.threshold, s.seen, got, s.want)
		}
		if got, _ := rdb.Get(ctx, key).Int64(); got != s.wantStored {
			t.Errorf("%s: stored %d, want %d", s.name, got, s.wantStored)
		}
	}
	if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 0 || ttl > time.Minute {
		t.Errorf("claim key PTTL %v, want it bounded by the claim TTL", ttl)
	}
}
