// Package backoff is the daemon's one back-off formula: how long to wait before retrying something that failed
// (a keyspace's query check, a reconnect to PostgreSQL, the start-up connect).
package backoff

import "time"

// Delay is the pause before retry number attempt (0 for the first retry): exponential from base, doubling per
// attempt, capped at maxDelay, with "equal jitter" so that many daemons (or keyspaces) failing together do not
// retry in lockstep: d/2 + u·d/2 for d = min(maxDelay, base·2^attempt) and u uniform in [0, 1), so the result is
// in [d/2, d). A negative attempt counts as 0. See "Exponential Backoff And Jitter", Marc Brooker, AWS
// Architecture Blog, 2015.
func Delay(attempt int, base, maxDelay time.Duration, u float64) time.Duration {
	attempt = max(attempt, 0)
	d := maxDelay
	if attempt < 62 && base > 0 && base <= maxDelay>>attempt {
		d = base << attempt
	}
	return d/2 + time.Duration(u*float64(d/2))
}
