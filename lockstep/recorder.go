package lockstep

import "time"

// Results of a rebuild, passed to Recorder.Rebuild (and used as the "result" label of the Prometheus recorder).
const (
	ResultOK       = "ok"        // loaded and published
	ResultLockLost = "lock_lost" // loaded, but the lock expired before the publish (nothing written)
	ResultMissing  = "missing"   // the origin has no such record: the loader returned an error wrapping ErrNotFound
	ResultError    = "error"     // the loader or Redis failed
)

// Outcomes of a follower's wait, passed to Recorder.Wait.
const (
	WaitHit      = "hit"      // another process published the value in time
	WaitStale    = "stale"    // the wait ended; the stale copy was served
	WaitTimeout  = "timeout"  // the wait ended with nothing to serve (ErrRebuildTimeout)
	WaitCanceled = "canceled" // the wait ended early: its context ended or the Client was closed
	WaitError    = "error"    // a read during the wait failed (Redis unreachable, or an error reply)
)

// Recorder receives the Client's events, for metrics. keyspace is the Client's keyspace name; implementations
// must never turn an id or a key into a label. Methods are called on the request path, concurrently: keep them
// fast and safe for concurrent use. lockstepprom.New returns a Prometheus one; the default records nothing.
type Recorder interface {
	// Hit counts a Get answered from the cache key on its first read.
	Hit(keyspace string)
	// Miss counts a Get whose first read found no value.
	Miss(keyspace string)
	// StaleServe counts a Get answered with the stale copy after its wait ended.
	StaleServe(keyspace string)
	// Rebuild records one loader call under the lock (on a miss or an XFetch early refresh): its duration d
	// (loader plus publish) and its result (ResultOK, ResultLockLost, ResultMissing, ResultError).
	Rebuild(keyspace string, d time.Duration, result string)
	// LockContention counts a lock found held by another token (the caller became a follower, or skipped a
	// background refresh).
	LockContention(keyspace string)
	// Wait records how long a follower waited for another process's rebuild, and how it ended (WaitHit,
	// WaitStale, WaitTimeout, WaitCanceled, WaitError).
	Wait(keyspace string, d time.Duration, result string)
	// EarlyRefresh counts an XFetch decision to refresh a hit ahead of its expiry (the refresh itself may still
	// find the lock held and skip).
	EarlyRefresh(keyspace string)
}

// NopRecorder is a Recorder that records nothing; it is the Client's default.
type NopRecorder struct{}

// Hit implements Recorder; it does nothing.
func (NopRecorder) Hit(string) {}

// Miss implements Recorder; it does nothing.
func (NopRecorder) Miss(string) {}

// StaleServe implements Recorder; it does nothing.
func (NopRecorder) StaleServe(string) {}

// Rebuild implements Recorder; it does nothing.
func (NopRecorder) Rebuild(string, time.Duration, string) {}

// LockContention implements Recorder; it does nothing.
func (NopRecorder) LockContention(string) {}

// Wait implements Recorder; it does nothing.
func (NopRecorder) Wait(string, time.Duration, string) {}

// EarlyRefresh implements Recorder; it does nothing.
func (NopRecorder) EarlyRefresh(string) {}

var _ Recorder = NopRecorder{}
