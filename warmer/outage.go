package warmer

import (
	"context"
	"sync"
	"time"
)

// outageSettle is how long a dependency must go without failures before an outage counts as over. Failures
// that flap (a pool that is exhausted one batch in three) are one outage, logged once, not a pair of lines per
// batch.
const outageSettle = 30 * time.Second

// outage tracks the failures of one dependency (the origin, or Redis) of one keyspace, so that they are logged
// once per outage: when it begins, and when it has been over for outageSettle. Safe for concurrent use; the
// zero value is ready.
type outage struct {
	mu       sync.Mutex
	active   bool
	last     time.Time // the last failure
	failures int       // failures since the outage began
	streak   int       // failures in a row since the last success
}

// fail records a failure at now and reports whether it begins an outage (log it). An outage begins only once
// `after` failures have come in a row (1: at the first).
func (o *outage) fail(now time.Time, after int) (begins bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.last = now
	o.streak++
	o.failures++
	if o.active || o.streak < after {
		return false
	}
	o.active = true
	o.failures = 1
	return true
}

// ok records a success at now and reports whether it ends the outage (log it, with the failures it counted):
// only once outageSettle has passed since the last failure.
func (o *outage) ok(now time.Time) (ends bool, failures int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.streak = 0
	if !o.active || now.Sub(o.last) < outageSettle {
		return false, 0
	}
	o.active = false
	return true, o.failures
}

// failing reports whether the last attempt failed (a failure with no success since), whether or not that began
// an outage.
func (o *outage) failing() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.streak > 0
}

// ongoing reports whether an outage has begun and not yet ended.
func (o *outage) ongoing() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.active
}

// redisError logs a Redis failure once per outage of this keyspace, not once per key or per pass.
func (k *keyspace) redisError(ctx context.Context, what string, err error) {
	if ctx.Err() != nil {
		return
	}
	if k.redis.fail(k.w.now(), 1) {
		k.log.Error("redis failing; will keep retrying", "op", what, "error", err)
	}
}

// redisOK notes a Redis round trip that succeeded; it logs the end of an outage.
func (k *keyspace) redisOK() {
	if ends, n := k.redis.ok(k.w.now()); ends {
		k.log.Info("redis recovered", "failures", n)
	}
}

// originFailed notes a failed origin query and logs, once per outage, that the fail-safe is serving current
// values. A client-side timeout alone (reason origin_timeout) does not begin an outage until a second batch in a
// row fails: a daemon that was paused (SIGSTOP, a stalled VM) past a query's deadline sees its own timer fire on
// resume although PostgreSQL answered long ago. Errors that come from the origin itself begin it at once.
//
// paused marks a query whose deadline fired well after it was due: the process itself was paused, so it does
// not count towards an outage at all.
func (k *keyspace) originFailed(cfg KeyspaceConfig, reason string, paused bool, cause error) {
	if paused {
		k.log.Info("origin query deadline fired late: this process was paused; not counted as an origin failure",
			"error", cause)
		return
	}
	after := 1
	if reason == ReasonOriginTimeout {
		after = 2
	}
	if !k.origin.fail(k.w.now(), after) {
		return
	}
	msg := "origin failing; serving current values past their TTL (fail-safe)"
	if reason == ReasonPoolExhausted {
		msg = "origin busy: no connection free within pool_wait_timeout; serving current values past their TTL (fail-safe)"
	}
	k.log.Error(msg, "reason", reason, "max_stale", cfg.MaxStale, "error", cause)
}

// originOK notes a successful origin query; the outage, if any, ends once outageSettle has passed without a
// failure.
func (k *keyspace) originOK() {
	if ends, n := k.origin.ok(k.w.now()); ends {
		k.log.Info("origin recovered; refreshes resumed", "failures", n)
	}
}

// oomExtending notes a batch whose locks Redis refused for memory and whose values are about to be extended
// without them; the first of an episode logs why, once for the whole warmer (not per key, per batch or per
// keyspace). The episode ends once Redis has taken writes again for outageSettle (oomOver).
func (k *keyspace) oomExtending(cfg KeyspaceConfig, cause error) {
	if k.w.oom.fail(k.w.now(), 1) {
		k.log.Error("redis refuses new keys (used memory > maxmemory, maxmemory-policy noeviction): no lock can "+
			"be taken, so hot values are kept by extending their TTLs without a lock (only where no lock exists, "+
			"within max_stale) until it takes writes again", "max_stale", cfg.MaxStale, "error", cause)
	}
}

// oomOver notes a write Redis took; it logs the end of an OOM episode once outageSettle has passed without a
// refusal.
func (w *Warmer) oomOver() {
	if ends, n := w.oom.ok(w.now()); ends {
		w.log.Info("redis takes new keys again; hot values are refreshed under their locks", "refused_batches", n)
	}
}
