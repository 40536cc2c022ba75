package lockstep

import "time"

// WithClock sets the clock that times a Client's rebuilds and waits (default time.Now): the rebuild time δ it
// stores in the metadata hash (MetaDeltaField, in milliseconds, the input of XFetch) and the durations it reports
// to the Recorder. Tests of apps that use lockstep pass a fake clock to make those exact. The follower's polling
// sleeps (WithWait) and the lock and value TTLs stay on real time and the Redis server's clock. now is called
// concurrently, so it must be safe for concurrent use.
func WithClock(now func() time.Time) Option {
	return func(c *config) error {
		if now == nil {
			return argError("clock", "nil")
		}
		c.now = now
		return nil
	}
}

// clock returns the current time by the Client's clock.
func (c *config) clock() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}
