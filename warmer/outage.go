package warmer

import "time"

// outageSettle is how long a dependency must go without failures before an outage counts as over. Failures
// that flap (a pool that is exhausted one batch in three) are one outage, logged once, not a pair of lines per
// batch.
const outageSettle = 30 * time.Second

// outage tracks the failures of one dependency (the origin, or Redis) of one keyspace, so that they are logged
// once per outage: when it begins, and when it has been over for outageSettle. Its methods are called with the
// keyspace's lock held.
type outage struct {
	active   bool
	last     time.Time // the last failure
	failures int       // failures since the outage began
}

// fail records a failure at now and reports whether it begins an outage (log it).
func (o *outage) fail(now time.Time) (begins bool) {
	o.last = now
	o.failures++
	if o.active {
		return false
	}
	o.active = true
	o.failures = 1
	return true
}

// ok records a success at now and reports whether it ends the outage (log it, with the failures it counted):
// only once outageSettle has passed since the last failure.
func (o *outage) ok(now time.Time) (ends bool, failures int) {
	if !o.active || now.Sub(o.last) < outageSettle {
		return false, 0
	}
	o.active = false
	return true, o.failures
}
