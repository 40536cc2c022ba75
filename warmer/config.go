package warmer

import (
	"errors"
	"fmt"
	"time"

	"github.com/keepwarm/keepwarm/lockstep"
)

// Missing policies: what a refresh does when the origin no longer has the record.
const (
	MissingDelete    = "delete"    // delete the cache key, its meta and stale copy
	MissingKeep      = "keep"      // leave the current value to expire on its own TTL
	MissingTombstone = "tombstone" // write Tombstone with TombstoneTTL
)

// Defaults for the zero fields of a KeyspaceConfig.
const (
	DefaultJitter           = 0.1
	DefaultBatchSize        = 100
	DefaultOriginConcurrent = 4
	DefaultMaxTracked       = 10000
	DefaultDecayHalfLife    = 10 * time.Minute
	DefaultMaxStale         = 5 * time.Minute
	DefaultLeadMultiple     = 3.0                   // lead is at least this many times the rebuild p95
	DefaultGatherWindow     = 20 * time.Millisecond // how long a refresher waits to fill a batch
	DefaultPollInterval     = 2 * time.Second       // how often hot-key signals are read
	DefaultReconcileEvery   = 5 * time.Second       // how often hot keys' PTTLs are re-read
	DefaultLFUCheckEvery    = 30 * time.Second      // how often an LFU keyspace re-reads maxmemory-policy
)

// KeyspaceConfig is one keyspace as the warmer needs it. Durations are wall-clock; zero fields take the
// DefaultX values noted on them.
type KeyspaceConfig struct {
	Name string         // bounded label value, e.g. "track"
	Keys *lockstep.Keys // key layout; required
	Src  Source         // origin of values; required
	TTL  time.Duration  // base TTL of a written value; > 0
	// Jitter spreads written TTLs over [TTL, TTL×(1+Jitter)); in [0,1]. Zero means none: set DefaultJitter
	// explicitly if wanted (the config loader does).
	Jitter float64
	// RefreshAhead is how long before expiry a hot key is refreshed; the lead actually used (Lead) is never less
	// than LeadMultiple × the key's measured rebuild p95, nor than StatementTimeout + PoolWaitTimeout, and never
	// more than TTL/2 (MaxLeadFraction). Default TTL/5; at most TTL/2.
	RefreshAhead time.Duration
	LockTTL      time.Duration // lease on a key's lock while it is rebuilt; > StatementTimeout. Default 5s.
	StaleTTL     time.Duration // TTL of the stale copy; 0 writes none (also when Keys has no stale template)
	// StatementTimeout bounds one origin query; lease extensions stop after StatementTimeout plus a margin.
	// Default LockTTL/2.
	StatementTimeout time.Duration
	// PoolWaitTimeout bounds how long one origin query may wait for a free origin connection before it runs
	// (the source's pool wait bound; 0 when the source does not wait). The lead is never less than
	// StatementTimeout + PoolWaitTimeout, so that a refresh that waits and runs as long as the config allows
	// still lands before the value expires.
	PoolWaitTimeout time.Duration

	BatchSize        int     // ids per origin query and per pipeline; default DefaultBatchSize
	MaxOriginQueries int     // concurrent origin queries; default DefaultOriginConcurrent
	OriginRate       float64 // origin queries per second (token bucket); 0 means unlimited

	TopN          int           // hot = the TopN best-scored ids, plus the pinned ones; 0 means pinned ids only
	MinScore      float64       // and only those scoring at least this; 0 means no floor
	MaxTracked    int           // bound on tracked ids; coldest leave first; default max(10×TopN, DefaultMaxTracked)
	DecayHalfLife time.Duration // access scores halve every DecayHalfLife; default DefaultDecayHalfLife
	LFU           bool          // also read Redis LFU counters (OBJECT FREQ) when maxmemory-policy is LFU
	LFUScanCount  int           // keys one poll's SCAN step asks for (the LFU signal's rate limit); default 1000
	// LFUCheckEvery is how often an LFU keyspace re-reads Redis's maxmemory-policy, so that a switch made at
	// runtime (CONFIG SET) turns the signal on or off without a restart; default DefaultLFUCheckEvery.
	LFUCheckEvery time.Duration

	MaxStale      time.Duration // fail-safe: how long a value may be kept past its TTL while the origin fails
	MaxValueBytes int           // values larger than this are refused (counted as errors); 0 means no limit

	Missing      string        // MissingDelete (default), MissingKeep or MissingTombstone
	Tombstone    []byte        // value written for a missing record under MissingTombstone
	TombstoneTTL time.Duration // TTL of a tombstone; required with MissingTombstone

	Pinned    []string // ids that are always hot
	AccessKey string   // sorted set of access scores; default lockstep.DefaultAccessKeyPrefix+Name

	LeadMultiple   float64       // default DefaultLeadMultiple
	PollInterval   time.Duration // default DefaultPollInterval
	ReconcileEvery time.Duration // default DefaultReconcileEvery
	GatherWindow   time.Duration // default DefaultGatherWindow
}

// withDefaults returns c with its zero fields set to their defaults, or an error naming each invalid field.
func (c KeyspaceConfig) withDefaults() (KeyspaceConfig, error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("keyspace %q: %s: %s", c.Name, field, fmt.Sprintf(format, args...)))
	}
	if c.Name == "" {
		bad("name", "is empty")
	}
	if c.Keys == nil {
		bad("keys", "is nil")
	}
	if c.Src == nil {
		bad("source", "is nil")
	}
	if c.TTL <= 0 {
		bad("ttl", "%v is not > 0", c.TTL)
	}
	if c.Jitter < 0 || c.Jitter > 1 {
		bad("jitter", "%v is outside [0,1]", c.Jitter)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.RefreshAhead, c.TTL/5)
	def(&c.LockTTL, 5*time.Second)
	def(&c.StatementTimeout, c.LockTTL/2)
	def(&c.DecayHalfLife, DefaultDecayHalfLife)
	def(&c.MaxStale, DefaultMaxStale)
	def(&c.PollInterval, DefaultPollInterval)
	def(&c.ReconcileEvery, DefaultReconcileEvery)
	def(&c.GatherWindow, DefaultGatherWindow)
	def(&c.LFUCheckEvery, DefaultLFUCheckEvery)
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.MaxOriginQueries == 0 {
		c.MaxOriginQueries = DefaultOriginConcurrent
	}
	if c.MaxTracked == 0 {
		c.MaxTracked = max(10*c.TopN, DefaultMaxTracked)
	}
	if c.LFUScanCount == 0 {
		c.LFUScanCount = lfuScanCount
	}
	if c.LeadMultiple == 0 {
		c.LeadMultiple = DefaultLeadMultiple
	}
	if c.Missing == "" {
		c.Missing = MissingDelete
	}
	if c.AccessKey == "" {
		c.AccessKey = lockstep.DefaultAccessKeyPrefix + c.Name
	}
	for name, d := range map[string]time.Duration{
		"refresh_ahead": c.RefreshAhead, "lock_ttl": c.LockTTL, "statement_timeout": c.StatementTimeout,
		"decay_half_life": c.DecayHalfLife, "max_stale": c.MaxStale, "stale_ttl": c.StaleTTL,
		"pool_wait_timeout": c.PoolWaitTimeout,
		"lfu_check_every":   c.LFUCheckEvery,
	} {
		if d < 0 {
			bad(name, "%v is negative", d)
		}
	}
	if c.TTL > 0 {
		maxLead := c.maxLead()
		if c.RefreshAhead > maxLead {
			bad("refresh_ahead", "%v is more than half the ttl %v: a value would be rebuilt before it had lived half its TTL",
				c.RefreshAhead, c.TTL)
		}
		if floor := c.originBound(); floor > maxLead {
			bad("ttl", "%v is too short for statement_timeout %v + pool_wait_timeout %v: a refresh may take %v, which "+
				"must fit in half the TTL (%v); raise ttl or lower statement_timeout / pool_wait_timeout",
				c.TTL, c.StatementTimeout, c.PoolWaitTimeout, floor, maxLead)
		}
	}
	if c.LockTTL <= c.StatementTimeout {
		bad("lock_ttl", "%v must be greater than the statement timeout %v", c.LockTTL, c.StatementTimeout)
	}
	if c.BatchSize < 0 || c.MaxOriginQueries < 0 || c.TopN < 0 || c.MaxTracked < 0 || c.MaxValueBytes < 0 {
		bad("batch_size/max_origin_concurrency/top_n/max_tracked/max_value_bytes", "must not be negative")
	}
	if c.MaxTracked < c.TopN+len(c.Pinned) {
		c.MaxTracked = c.TopN + len(c.Pinned)
	}
	if c.OriginRate < 0 {
		bad("origin_rate", "%v is negative", c.OriginRate)
	}
	switch c.Missing {
	case MissingDelete, MissingKeep:
	case MissingTombstone:
		if c.TombstoneTTL <= 0 {
			bad("tombstone_ttl", "%v is not > 0 (required with missing = \"tombstone\")", c.TombstoneTTL)
		}
	default:
		bad("missing", "%q is not delete, keep or tombstone", c.Missing)
	}
	for _, id := range c.Pinned {
		if err := lockstep.ValidateID(id); err != nil {
			bad("pinned", "%v", err)
		}
	}
	return c, errors.Join(errs...)
}

// MaxLeadFraction caps the lead at this fraction of the TTL: a written value lives at least TTL/2 before its next
// refresh is due (TTL/4 with the XFetch-style early offset, which is at most lead/2), so a key is never rebuilt
// again within one value's lifetime however slow its rebuilds are measured to be.
const MaxLeadFraction = 0.5

func (c KeyspaceConfig) maxLead() time.Duration {
	return time.Duration(float64(c.TTL) * MaxLeadFraction)
}

// originBound is the longest one refresh may take by the config: the wait for an origin connection plus the
// statement timeout.
func (c KeyspaceConfig) originBound() time.Duration { return c.StatementTimeout + c.PoolWaitTimeout }

// Lead is how long before its expiry a hot key whose rebuilds take rebuildP95 (0: not measured yet) is
// refreshed: the largest of RefreshAhead, LeadMultiple × rebuildP95 and StatementTimeout + PoolWaitTimeout, capped
// at TTL × MaxLeadFraction. This is the one definition of the lead; the scheduler, the re-check under the lock,
// the short-notice test and the fail-safe all use it. Call it on a config returned by New's validation.
func (c KeyspaceConfig) Lead(rebuildP95 time.Duration) time.Duration {
	l := max(c.RefreshAhead, c.originBound())
	if m := time.Duration(c.LeadMultiple * float64(rebuildP95)); m > l {
		l = m
	}
	return min(l, c.maxLead())
}

// LeadNote says, when it applies, that the configured refresh_ahead is raised to fit the worst-case refresh the
// config allows (statement_timeout + pool_wait_timeout); "" otherwise. validate prints it and run logs it.
func (c KeyspaceConfig) LeadNote() string {
	if b := c.originBound(); c.RefreshAhead < b {
		return fmt.Sprintf("keyspace %q: refresh_ahead %v is raised to %v = statement_timeout %v + pool_wait_timeout %v, "+
			"so that a refresh that waits for a connection and runs as long as allowed still lands before expiry",
			c.Name, c.RefreshAhead, b, c.StatementTimeout, c.PoolWaitTimeout)
	}
	return ""
}
