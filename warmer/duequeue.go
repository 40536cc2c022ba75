package warmer

import (
	"github.com/keepwarm/keepwarm/internal/backoff"
	"math"
	"slices"
	"time"
)

// dueAt returns when a key expiring at expiry should be refreshed: expiry − lead − an XFetch-style early offset.
// The offset is δ·β·(−ln u) with δ the rebuild estimate, β = 1 and u in (0,1], i.e. the moment at which XFetch's
// test "now − δβ·ln(u) ≥ expiry" first holds for one draw (Vattani, Chierichetti, Lowenstein, "Optimal
// Probabilistic Cache Stampede Prevention", VLDB 2015). Several daemon replicas draw different u and so do not
// collide on the same key at the same instant. The offset is capped at lead/2 so the spread never doubles the
// lead.
func dueAt(expiry time.Time, ld, rebuild time.Duration, u float64) time.Time {
	if u <= 0 || u > 1 {
		u = 1
	}
	early := time.Duration(float64(rebuild) * -math.Log(u))
	early = min(early, ld/2)
	return expiry.Add(-ld - early)
}

// scheduleLocked queues h for its next refresh given its known expiry.
func (k *keyspace) scheduleLocked(h *hotState) {
	if h.e.hot != h || h.persistent || !k.ownsLocked(h.id) {
		return
	}
	now := k.w.now()
	if h.expiry.IsZero() {
		k.q.schedule(h, now)
		return
	}
	k.q.schedule(h, dueAt(h.expiry, k.leadLocked(h), k.rebuildEstimateLocked(h), 1-k.rnd.Float64()))
}

// rebuildEstimateLocked is h's rebuild p95, or the keyspace's for a key not rebuilt yet.
func (k *keyspace) rebuildEstimateLocked(h *hotState) time.Duration {
	if h.rebuildP95 > 0 {
		return h.rebuildP95
	}
	return k.p95.p95()
}

// leadLocked is how long before its expiry h is refreshed: the one place where the lead is computed (see
// KeyspaceConfig.Lead), used by the scheduler, the re-check under the lock, the short-notice test and the
// fail-safe alike.
func (k *keyspace) leadLocked(h *hotState) time.Duration {
	return k.cfg.Lead(k.rebuildEstimateLocked(h))
}

// retryMargin is how long before a key's known expiry its last retry is started, beyond its rebuild estimate.
const retryMargin = 100 * time.Millisecond

// retryLocked queues h for another attempt after retryDelayLocked (see retryAtLocked).
func (k *keyspace) retryLocked(h *hotState, base time.Duration) {
	k.retryAtLocked(h, k.retryDelayLocked(h, base))
}

// retryAtLocked queues h for another attempt after delay, but never after its known expiry: while the value is
// still there, the attempt is brought forward to expiry − rebuild estimate − retryMargin (at least
// lockedRecheckMin from now), so that a back-off drawn for a transient failure (TRYAGAIN, ASK, MOVED,
// CLUSTERDOWN, a lock held elsewhere) cannot carry the retry past the moment the value expires. A key whose value
// has expired already (or is unknown) keeps the full back-off.
func (k *keyspace) retryAtLocked(h *hotState, delay time.Duration) {
	if h.e.hot != h || !k.ownsLocked(h.id) {
		return
	}
	now := k.w.now()
	k.q.schedule(h, retryAt(now, delay, h.expiry, k.rebuildEstimateLocked(h)))
}

// retryAt is retryAtLocked's rule: now + delay, capped for a value that expires at expiry (zero: unknown) and takes
// rebuild to rebuild.
func retryAt(now time.Time, delay time.Duration, expiry time.Time, rebuild time.Duration) time.Time {
	at := now.Add(delay)
	if expiry.IsZero() || !expiry.After(now) {
		return at
	}
	latest := expiry.Add(-rebuild - retryMargin)
	if floor := now.Add(lockedRecheckMin); latest.Before(floor) {
		latest = floor
	}
	if at.After(latest) {
		return latest
	}
	return at
}

// retryDelayLocked is the back-off before another attempt at h (backoff.Delay, the daemon's one formula): in
// [base, 2·base) doubled per consecutive error of h, capped at max(TTL/2, 1s), jittered so that keys that failed
// together (and replicas) do not retry in step.
func (k *keyspace) retryDelayLocked(h *hotState, base time.Duration) time.Duration {
	return k.retryDelayDrawLocked(h, base, k.rnd.Float64())
}

// retryDelayDrawLocked is retryDelayLocked with the uniform draw u in [0, 1) given: the fail-safe draws once per
// batch (failSafe).
func (k *keyspace) retryDelayDrawLocked(h *hotState, base time.Duration, u float64) time.Duration {
	return backoff.Delay(h.errors+1, base, max(k.cfg.TTL/2, time.Second), u)
}

// rebuildWindow keeps the last rebuild durations of a keyspace for a keyspace-wide p95, used for keys that have
// not been rebuilt yet.
type rebuildWindow struct {
	buf    [128]time.Duration
	n, i   int
	cached time.Duration
	dirty  bool
}

func (r *rebuildWindow) add(d time.Duration) {
	r.buf[r.i] = d
	r.i = (r.i + 1) % len(r.buf)
	if r.n < len(r.buf) {
		r.n++
	}
	r.dirty = true
}

func (r *rebuildWindow) p95() time.Duration {
	if r.n == 0 || !r.dirty {
		return r.cached
	}
	s := make([]time.Duration, r.n)
	copy(s, r.buf[:r.n])
	slices.Sort(s)
	r.cached, r.dirty = s[(len(s)*95)/100], false
	return r.cached
}
