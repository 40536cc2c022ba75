package lockstep

import (
	"math"
	"time"
)

// XFetch decides whether a reader should refresh a cached value early, before it expires, so that one reader
// refreshes a hot key ahead of time instead of all readers stampeding when it expires. It implements "optimal
// probabilistic cache stampede prevention" (XFetch; A. Vattani, F. Chierichetti, K. Lowenstein, VLDB 2015):
// refresh when
//
//	now − δ·β·ln(u) ≥ expiry
//
// where δ (delta) is how long the last rebuild took, β (beta, > 0; 1 is the paper's default, larger refreshes
// earlier) scales the eagerness, and u is uniform in (0, 1]. With r = expiry − now remaining, the probability is
// P(refresh) = exp(−r/(δ·β)): near 1 close to expiry, negligible many δ before it. A value already expired
// (r ≤ 0) always refreshes; δ ≤ 0 or β ≤ 0 refresh only then. u ≤ 0 counts as the smallest u (always refresh),
// u > 1 as 1.
//
// Beware the shortcut copied around the web that compares rand() with exp(remaining/β): exp of a positive number
// exceeds 1, so it never fires.
func XFetch(now, expiry time.Time, delta time.Duration, beta, u float64) bool {
	remaining := expiry.Sub(now)
	if remaining <= 0 {
		return true
	}
	if delta <= 0 || !(beta > 0) {
		return false
	}
	if !(u > 0) {
		return true
	}
	if u > 1 {
		u = 1
	}
	gap := -float64(delta) * beta * math.Log(u) // ≥ 0, in ns; may be +Inf
	return gap >= float64(remaining)
}
