package lockstep_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/redis/go-redis/v9"
)

// TestXFetchDistribution checks the Client's early refreshes against XFetch's law: with r the remaining TTL and δ
// the last rebuild's duration, a hit refreshes early with probability P = P(−δβ ln u ≥ r) = exp(−r/(δβ)).
// miniredis holds the remaining TTL still while the test samples (real Redis would count it down), and the lock is
// held elsewhere so no refresh changes the TTL; the test counts XFetch decisions through the Recorder. The random
// source is seeded, so the run is deterministic. Tolerance: ±0.035 absolute on n = 2000 samples per point, about
// 3σ of the binomial error at p = 0.5 (σ = √(p(1−p)/n) ≈ 0.011), so a correct implementation passes with almost
// any seed while a wrong law (e.g. the `rand() < exp(r/β)` shortcut, which never fires) fails by far.
func TestXFetchDistribution(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	keys := mustKeys(t, "", false)
	ks := mustFor(t, keys, "hot")
	const delta = 200 * time.Millisecond
	if err := mr.Set(ks.Cache, "v"); err != nil {
		t.Fatal(err)
	}
	mr.HSet(ks.Meta, lockstep.MetaDeltaField, "200")
	if err := mr.Set(ks.Lock, "held elsewhere"); err != nil { // background refreshes find the lock held and skip
		t.Fatal(err)
	}
	const n = 2000
	points := map[float64][]time.Duration{
		1: {20 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond},
		2: {100 * time.Millisecond, 400 * time.Millisecond},
	}
	for _, beta := range []float64{1, 2} {
		rec := newCountingRecorder()
		c := newClient(t, rdb, "product", keys, func(context.Context, string) ([]byte, error) {
			t.Error("loader called although the lock is held elsewhere")
			return nil, nil
		}, time.Minute, lockstep.WithXFetch(beta), lockstep.WithRecorder(rec), lockstep.WithRand(lockedRand(42)),
			lockstep.WithMeta(true)) // δ from the meta hash
		for _, remaining := range points[beta] {
			mr.SetTTL(ks.Cache, remaining)
			before := rec.early.Load()
			for range n {
				if v, err := c.Get(ctx, "hot"); err != nil || string(v) != "v" {
					t.Fatalf("Get = %q, %v", v, err)
				}
			}
			got := float64(rec.early.Load()-before) / n
			want := math.Exp(-float64(remaining) / (float64(delta) * beta))
			if math.Abs(got-want) > 0.035 {
				t.Errorf("β %v, remaining %v: early refresh rate %.3f, want exp(−r/δβ) = %.3f ± 0.035", beta, remaining, got, want)
			} else {
				t.Logf("β %v, remaining %v: early refresh rate %.3f, want %.3f", beta, remaining, got, want)
			}
		}
	}
}
