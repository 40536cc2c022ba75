package warmer

import "sync"

// CanaryTTL is the flush canary's TTL, for tests that outlast it.
const CanaryTTL = canaryTTL

// BlockLoop blocks keyspace name's scheduler loop, as a Redis call that hangs would, until release is called: a
// message that waits. It returns once the loop is blocked.
func (w *Warmer) BlockLoop(name string) (release func()) {
	blocked, rel := make(chan struct{}), make(chan struct{})
	w.keyspace(name).mail.Send(func(*loopState) {
		close(blocked)
		<-rel
	})
	<-blocked
	var once sync.Once
	return func() { once.Do(func() { close(rel) }) }
}

// EventQueuePeak is the most hot ids whose notification events waited at once for keyspace name's loop since
// the last call (since start for the first).
func (w *Warmer) EventQueuePeak(name string) int {
	in := &w.keyspace(name).intake
	in.mu.Lock()
	defer in.mu.Unlock()
	peak := in.peak
	in.peak = len(in.pending)
	return peak
}

// MailboxQueued is how many messages wait for keyspace name's loop.
func (w *Warmer) MailboxQueued(name string) int { return w.keyspace(name).mail.Queued() }

// SetCronFired makes c call fired, on the goroutine that owns its schedules, for each firing it counts in
// keepwarm_schedule_runs_total, with the result: tests wait on firings instead of polling the metrics. Call it
// before Run.
func SetCronFired(c *Cron, fired func(schedule, result string)) { c.fired = fired }
