package warmer

// CanaryTTL is the flush canary's TTL, for tests that outlast it.
const CanaryTTL = canaryTTL

// SetCronFired makes c call fired, on the goroutine that owns its schedules, for each firing it counts in
// keepwarm_schedule_runs_total, with the result: tests wait on firings instead of polling the metrics. Call it
// before Run.
func SetCronFired(c *Cron, fired func(schedule, result string)) { c.fired = fired }
