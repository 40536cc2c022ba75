package lockstep

import (
	"math"
	"time"
)

// DefaultJitter is the default TTL jitter fraction of a Client (see Jitter and WithJitter).
const DefaultJitter = 0.1

// Jitter spreads expiries so that keys written together do not expire together: it returns
// ttl × (1 + u·jitter), where u is uniform in [0, 1) and jitter is a fraction (0.1 = up to 10% longer), so the
// result lies in [ttl, ttl×(1+jitter)). The client, the daemon and the warm-up all use it, so every writer spreads
// the same way. For ttl > 0 the result is never below ttl, never ≤ 0 and never overflows (it saturates at the
// largest Duration). Out-of-range inputs are clamped rather than rejected: jitter < 0 or NaN counts as 0, u
// outside [0, 1) is clamped into it. A ttl ≤ 0 is returned unchanged (there is nothing to jitter).
func Jitter(ttl time.Duration, jitter, u float64) time.Duration {
	if ttl <= 0 || !(jitter > 0) || !(u > 0) {
		return ttl
	}
	if u >= 1 {
		u = math.Nextafter(1, 0)
	}
	extra := float64(ttl) * u * jitter
	// The upper bound is exclusive: keep ttl+extra < ttl×(1+jitter) despite float rounding.
	if limit := float64(ttl) * jitter; extra >= limit {
		extra = math.Nextafter(limit, 0)
	}
	if extra >= float64(math.MaxInt64-ttl) {
		return time.Duration(math.MaxInt64)
	}
	return ttl + time.Duration(extra)
}
