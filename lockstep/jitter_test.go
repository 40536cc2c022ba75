package lockstep_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/lockstep"
)

func TestJitter(t *testing.T) {
	t.Parallel()
	almostOne := math.Nextafter(1, 0)
	tests := []struct {
		name   string
		ttl    time.Duration
		jitter float64
		u      float64
		want   time.Duration
	}{
		{"u 0 gives ttl", time.Minute, 0.1, 0, time.Minute},
		{"u half", time.Minute, 0.1, 0.5, time.Minute + 3*time.Second},
		{"jitter 0", time.Minute, 0, 0.9, time.Minute},
		{"jitter 1", time.Minute, 1, 0.5, 90 * time.Second},
		{"u just below 1 stays below the bound", time.Minute, 0.1, almostOne, 66*time.Second - 1},
		{"u 1 clamps below the bound", time.Minute, 0.1, 1, 66*time.Second - 1},
		{"u above 1 clamps", time.Minute, 0.1, 7, 66*time.Second - 1},
		{"negative u clamps to 0", time.Minute, 0.1, -3, time.Minute},
		{"NaN u counts as 0", time.Minute, 0.1, math.NaN(), time.Minute},
		{"negative jitter counts as 0", time.Minute, -0.5, 0.5, time.Minute},
		{"NaN jitter counts as 0", time.Minute, math.NaN(), 0.5, time.Minute},
		{"1ns ttl", 1, 0.1, 0.5, 1},
		{"huge ttl saturates", math.MaxInt64 - 10, 1, 0.9, math.MaxInt64},
		{"zero ttl unchanged", 0, 0.1, 0.5, 0},
		{"negative ttl unchanged", -time.Second, 0.1, 0.5, -time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := lockstep.Jitter(tt.ttl, tt.jitter, tt.u); got != tt.want {
				t.Fatalf("Jitter(%v, %v, %v) = %v, want %v", tt.ttl, tt.jitter, tt.u, got, tt.want)
			}
		})
	}
}

// TestJitterBounds is a property test: for any positive ttl, jitter in [0, 1] and u in [0, 1), the result lies in
// [ttl, ttl×(1+jitter)) (== ttl when jitter is 0), and u spreads it over the whole range.
func TestJitterBounds(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(7, 11))
	for i := range 200000 {
		ttl := time.Duration(1 + r.Int64N(int64(48*time.Hour)))
		if i%10 == 0 {
			ttl = time.Duration(1 + r.Int64N(1000)) // tiny TTLs, where rounding matters most
		}
		jitter := r.Float64()
		if i%7 == 0 {
			jitter = 1
		}
		u := r.Float64()
		got := lockstep.Jitter(ttl, jitter, u)
		upper := float64(ttl) * (1 + jitter)
		if got < ttl || (jitter > 0 && float64(got) >= upper && float64(ttl)*jitter >= 1) || got <= 0 {
			t.Fatalf("Jitter(%d, %v, %v) = %d, want in [%d, %.0f)", ttl, jitter, u, got, ttl, upper)
		}
	}
	// The spread covers the range: with jitter 0.1 the mean extra is about 5% of ttl.
	var sum float64
	const n = 100000
	for range n {
		sum += float64(lockstep.Jitter(time.Hour, 0.1, r.Float64()) - time.Hour)
	}
	if mean := sum / n / float64(time.Hour); math.Abs(mean-0.05) > 0.002 {
		t.Errorf("mean jitter = %.4f of ttl, want 0.05 ± 0.002", mean)
	}
}

func TestXFetch(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	δ := time.Second
	tests := []struct {
		name      string
		remaining time.Duration
		delta     time.Duration
		beta, u   float64
		want      bool
	}{
		// −δβ ln u with δβ = 1s: u = e^−1 ≈ 0.3679 gives exactly 1s.
		{"gap exceeds remaining", 900 * time.Millisecond, δ, 1, math.Exp(-1), true},
		{"gap short of remaining", 1100 * time.Millisecond, δ, 1, math.Exp(-1), false},
		{"u 1 never refreshes early", time.Millisecond, δ, 1, 1, false},
		{"tiny u refreshes early", 10 * time.Minute, δ, 1, 1e-300, true}, // −ln 1e-300 ≈ 690.8
		{"u 0 always refreshes", time.Hour, δ, 1, 0, true},
		{"larger beta refreshes earlier", 1900 * time.Millisecond, δ, 2, math.Exp(-1), true},
		{"expired always refreshes", 0, δ, 1, 1, true},
		{"past expiry always refreshes", -time.Second, 0, 0, 1, true},
		{"no delta, not expired", time.Millisecond, 0, 1, 1e-9, false},
		{"no beta, not expired", time.Millisecond, δ, 0, 1e-9, false},
		{"NaN beta", time.Millisecond, δ, math.NaN(), 1e-9, false},
		// The widely copied shortcut `rand() < exp(remaining/β)`-style checks never fire; XFetch does.
		{"fires well before expiry with small u", 10 * time.Second, δ, 1, 1e-5, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := lockstep.XFetch(now, now.Add(tt.remaining), tt.delta, tt.beta, tt.u)
			if got != tt.want {
				t.Fatalf("XFetch(remaining %v, δ %v, β %v, u %v) = %v, want %v", tt.remaining, tt.delta, tt.beta, tt.u, got, tt.want)
			}
		})
	}
}
