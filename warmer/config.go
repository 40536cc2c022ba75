package warmer

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/keepwarm/keepwarm/lockstep"
)

// Missing policies: what a refresh does when the origin no longer has the record. The one definition of the enum:
// the config file's missing takes these words, and a zero Missing is MissingDelete.
const (
	MissingDelete    = "delete"    // delete the cache key, its meta and stale copy
	MissingKeep      = "keep"      // leave the current value to expire on its own TTL
	MissingTombstone = "tombstone" // write Tombstone with TombstoneTTL
)

// Defaults, units and bounds of a KeyspaceConfig: the one definition of each. Resolve applies every default
// whose zero value means "the default"; internal/config's table of keyspace fields refers to these and applies
// only the few a zero cannot mean (DefaultTopN, DefaultMinScore, DefaultMaxValueBytes, and lockstep.DefaultJitter
// for Jitter), because there zero is a setting of its own.
const (
	// DefaultRefreshAheadFraction: a zero RefreshAhead and RefreshAheadFraction is this fraction of the TTL.
	DefaultRefreshAheadFraction = 0.2
	// DefaultStatementTimeout is a zero StatementTimeout, and the daemon's [postgres] statement_timeout default.
	DefaultStatementTimeout = 5 * time.Second
	// DefaultMinLockTTL: a zero LockTTL is the larger of this and 2 × StatementTimeout (see LockTTL). It is twice
	// DefaultStatementTimeout, and deliberately not lockstep.DefaultLockTTL (5 s): an app's lockstep client
	// rebuilds one key with no configured bound, while the daemon's lock must outlive a whole batch query that
	// may run for the statement timeout, plus its client-side margin of LockTTL/3. Apps sharing a keyspace with the
	// daemon pass the keyspace's lock_ttl to lockstep.WithLockTTL.
	DefaultMinLockTTL = 2 * DefaultStatementTimeout
	// DefaultStaleTTLFactor: a zero StaleTTL, when Keys has a stale template, is this many TTLs.
	DefaultStaleTTLFactor = 10
	DefaultBatchSize      = 100
	MaxBatchSize          = 100000
	// DefaultMaxOriginConcurrency is the default MaxOriginConcurrency.
	DefaultMaxOriginConcurrency = 4
	// DefaultTopN is the config file's top_n. Resolve does not apply it: a zero TopN means pinned ids only.
	DefaultTopN = 1000
	// DefaultMinScore is the config file's min_score. Resolve does not apply it: a zero MinScore means no floor.
	DefaultMinScore = 1.0
	// DefaultMaxValueBytes is the config file's max_value_bytes. Resolve does not apply it: a zero MaxValueBytes
	// means no limit.
	DefaultMaxValueBytes = 1 << 20
	// MaxValueBytesLimit is the largest MaxValueBytes: Redis's own limit on a string value.
	MaxValueBytesLimit = 512 << 20
	// DefaultMaxTrackedFactor and DefaultMaxTracked: a zero MaxTracked is max(DefaultMaxTrackedFactor × TopN,
	// DefaultMaxTracked).
	DefaultMaxTrackedFactor = 10
	DefaultMaxTracked       = 10000
	// MaxTrackedLimit bounds MaxTracked: the tracker's frequency sketch is allocated for it at start (8 to 16 bytes
	// per id, 128 MiB at this bound), and the entries cost about 120 bytes per id more (docs/benchmarks.md §13).
	MaxTrackedLimit = 10_000_000
	// MaxTopN bounds TopN (and so MaxTracked's default): hot sets are read and sorted in full each poll.
	MaxTopN              = 1_000_000
	DefaultDecayHalfLife = 10 * time.Minute
	// DefaultHistoryFactor is HistoryHalfLife's default in multiples of DecayHalfLife (see sketch.go; 3× and
	// 6× measured on the ARC and key-value traces: docs/benchmarks.md §13).
	DefaultHistoryFactor = 6
	DefaultMaxStale      = 5 * time.Minute
	DefaultLeadMultiple  = 3.0                   // lead is at least this many times the rebuild p95
	DefaultGatherWindow  = 20 * time.Millisecond // how long a refresher waits to fill a batch
	DefaultPollInterval  = 2 * time.Second       // how often hot-key signals are read
	// DefaultReconcileEvery is how often an untrusted hot key's PTTL is re-read (see ReconcileEvery).
	DefaultReconcileEvery = 5 * time.Second
	// DefaultReconcileTrustedEvery is how often a trusted hot key's PTTL is re-read (see ReconcileTrustedEvery).
	DefaultReconcileTrustedEvery = 5 * time.Minute
	// DefaultReconcileBudget is the default ReconcileBudget, in PTTL commands per second per keyspace: 5% of
	// what this project's 2-core test machine's Redis serves pipelined, and enough to re-check 50,000 untrusted
	// hot keys every 5 s.
	DefaultReconcileBudget = 10000
	// MaxDuration is the upper bound of every duration setting (one year): far beyond any sensible TTL, and low
	// enough that every value derived from one (DefaultStaleTTLFactor × TTL, 2 × StatementTimeout, a jittered
	// TTL, TTL + spread) stays far from time.Duration's 292-year overflow.
	MaxDuration          = 366 * 24 * time.Hour
	DefaultLFUCheckEvery = 30 * time.Second // how often an LFU keyspace re-reads maxmemory-policy
)

// KeyspaceConfig is one keyspace as the warmer needs it. Durations are wall-clock, each in (0, MaxDuration];
// zero fields take the defaults noted on them (Resolve applies them). internal/config fills it from a
// [[keyspace]] table, field for field.
type KeyspaceConfig struct {
	Name string         // bounded label value, e.g. "track"
	Keys *lockstep.Keys // key layout; required
	Src  Source         // origin of values; required by New and Update, not by Resolve
	TTL  time.Duration  // base TTL of a written value; required, in (0, MaxDuration]
	// Jitter spreads written TTLs over [TTL, TTL×(1+Jitter)); in [0,1]. Zero means none (the config file's
	// default is lockstep.DefaultJitter, the spread of lockstep's client, so that apps and daemon spread alike).
	Jitter float64
	// RefreshAhead is how long before expiry a hot key is refreshed; the lead actually used (Lead) is never less
	// than LeadMultiple × the key's measured rebuild p95, nor than StatementTimeout + PoolWaitTimeout, and never
	// more than TTL/2 (MaxLeadFraction). At most TTL/2. Zero means RefreshAheadFraction × TTL (Resolve sets it).
	RefreshAhead time.Duration
	// RefreshAheadFraction is RefreshAhead as a fraction of the TTL, in (0, 1) (the config file's "20%" or 0.2);
	// used only when RefreshAhead is zero. Zero means DefaultRefreshAheadFraction; Resolve sets it when it
	// derives RefreshAhead, so a resolved config says which form it came from.
	RefreshAheadFraction float64
	// StatementTimeout bounds one origin query (the client gives up after StatementTimeout + LockTTL/3); the daemon
	// sets it from [postgres] statement_timeout. Default DefaultStatementTimeout.
	//
	// LockTTL is the lease on a key's lock while an app rebuilds it (lockstep.WithLockTTL), and the upper bound
	// of the daemon's own, shorter lease, renewed while a batch holds its locks (see lease); above
	// StatementTimeout. Default max(DefaultMinLockTTL, 2 × StatementTimeout).
	//
	// The two derive in one direction only: StatementTimeout (the origin's bound) is given or defaulted first,
	// and LockTTL's default derives from it, since the lock must outlive the query; StatementTimeout never
	// derives from LockTTL.
	StatementTimeout time.Duration
	LockTTL          time.Duration
	// StaleTTL is the TTL of the stale copy, above TTL; written only when Keys has a stale template. Default
	// DefaultStaleTTLFactor × TTL when it has one, else 0.
	StaleTTL time.Duration
	// PoolWaitTimeout bounds how long one origin query may wait for a free origin connection before it runs
	// (the source's pool wait bound; 0 when the source does not wait). The lead is never less than
	// StatementTimeout + PoolWaitTimeout, so that a refresh that waits and runs as long as the config allows
	// still lands before the value expires.
	PoolWaitTimeout time.Duration

	BatchSize            int     // ids per origin query and per pipeline, in [1, MaxBatchSize]; default DefaultBatchSize
	MaxOriginConcurrency int     // batches querying the origin at once (TOML max_origin_concurrency); default DefaultMaxOriginConcurrency
	OriginRate           float64 // origin queries per second (token bucket); 0 means unlimited

	TopN     int     // hot = the TopN best-scored ids, plus the pinned ones; in [0, MaxTopN]; 0 means pinned ids only (the config file's default: DefaultTopN)
	MinScore float64 // and only those scoring at least this; 0 means no floor (the config file's default: DefaultMinScore)
	// MaxTracked bounds the tracked ids (coldest leave first). Default max(DefaultMaxTrackedFactor × TopN,
	// DefaultMaxTracked). A set value below TopN is an error; Resolve raises it to TopN + len(Pinned) when the
	// pinned ids would not fit (they are always tracked).
	MaxTracked    int
	DecayHalfLife time.Duration // access scores halve every DecayHalfLife; default DefaultDecayHalfLife
	// HistoryHalfLife is how fast the selection's long memory of reads fades: the frequency sketch's counts
	// (sketch.go) halve every HistoryHalfLife. It lets ids re-read at gaps longer than DecayHalfLife keep their
	// admission and rank between reads. Default DefaultHistoryFactor × DecayHalfLife (at least 1s, at most
	// MaxDuration); a set value must be at least DecayHalfLife and 1s.
	HistoryHalfLife time.Duration
	LFU             bool // also read Redis LFU counters (OBJECT FREQ) when maxmemory-policy is LFU
	LFUScanCount    int  // keys one poll's SCAN step asks for (the LFU signal's rate limit); default 1000
	// LFUCheckEvery is how often an LFU keyspace re-reads Redis's maxmemory-policy, so that a switch made at
	// runtime (CONFIG SET) turns the signal on or off without a restart; default DefaultLFUCheckEvery.
	LFUCheckEvery time.Duration

	MaxStale time.Duration // fail-safe: how long a value may be kept past its TTL while the origin fails; default DefaultMaxStale
	// KeepMeta also writes the meta hash (written_ms, delta_ms) beside each value (lockstep.Write.NoMeta when
	// false). Default false: the daemon does not read it (it knows its own writes and reads PTTL for others), and
	// it cost a 314-byte value 38% more Redis memory than a plain SET (docs/benchmarks.md §9.1). Turn it on for apps
	// that read delta_ms for XFetch from Redis.
	KeepMeta bool
	// MaxValueBytes refuses larger values (counted as errors); in [0, MaxValueBytesLimit]; 0 means no limit (the
	// config file's default: DefaultMaxValueBytes).
	MaxValueBytes int

	Missing   string // MissingDelete (default), MissingKeep or MissingTombstone
	Tombstone []byte // value written for a missing record under MissingTombstone
	// TombstoneTTL is the TTL of a tombstone; required with MissingTombstone, with no default here. (The config
	// file's default is the keyspace's ttl, applied by internal/config: Go callers of New have always had to set
	// it, and warmer's tests hold them to it.)
	TombstoneTTL time.Duration

	Pinned    []string // ids that are always hot; each must pass lockstep.ValidateID and the Source's IDValidator
	AccessKey string   // sorted set of access scores; default lockstep.DefaultAccessKeyPrefix+Name

	LeadMultiple float64       // default DefaultLeadMultiple
	PollInterval time.Duration // default DefaultPollInterval
	// ReconcileEvery is how often the PTTL of a hot key the daemon cannot trust is re-read: one adopted from an
	// app (its expiry learnt with PTTL), or any key while keyspace notifications are off or were lost since the
	// daemon wrote it. Default DefaultReconcileEvery. See reconcile.go.
	ReconcileEvery time.Duration
	// ReconcileTrustedEvery is how often the PTTL of a trusted hot key is re-read: one the daemon wrote itself
	// while notifications were confirmed healthy, and healthy ever since. Each refresh of the key defers it.
	// Default DefaultReconcileTrustedEvery; at least ReconcileEvery.
	ReconcileTrustedEvery time.Duration
	// ReconcileBudget bounds the reconciliation's PTTL commands per second for this keyspace, sent in equal
	// shares every 250 ms instead of one burst per interval; when the hot set needs more, checks are spread
	// further apart (keepwarm_warmer_reconcile_lag_seconds rises, and a warning is logged). Default
	// DefaultReconcileBudget; at least 1.
	ReconcileBudget int
	GatherWindow    time.Duration // default DefaultGatherWindow
}

// FieldError is one invalid field of a KeyspaceConfig: `keyspace "track": stale_ttl: ...`. Field is the
// config file's key.
type FieldError struct {
	Keyspace, Field, Msg string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("keyspace %q: %s: %s", e.Keyspace, e.Field, e.Msg)
}

// mulDuration returns d×k, or false if it overflows.
func mulDuration(d time.Duration, k int64) (time.Duration, bool) {
	if k == 0 || d == 0 {
		return 0, true
	}
	if d > math.MaxInt64/time.Duration(k) || d < math.MinInt64/time.Duration(k) {
		return 0, false
	}
	return d * time.Duration(k), true
}

// scaleDuration returns d×f (f ≥ 0), or false if it does not fit in a time.Duration.
func scaleDuration(d time.Duration, f float64) (time.Duration, bool) {
	v := float64(d) * f
	if math.IsNaN(v) || v >= math.MaxInt64 || v < math.MinInt64 {
		return 0, false
	}
	return time.Duration(v), true
}

// Resolve returns c with its zero fields set to their defaults, or an error joining one *FieldError per
// invalid field. It checks everything New checks except Src, so a config can be validated without its origin
// (`keepwarm validate` calls it through internal/config, and New and Update call it too: one code path, one
// message). Every derived value is computed with overflow checks.
func (c KeyspaceConfig) Resolve() (KeyspaceConfig, error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Keyspace: c.Name, Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	if c.Name == "" {
		bad("name", "is empty")
	}
	if c.Keys == nil {
		bad("keys", "is nil")
	}
	for name, d := range map[string]time.Duration{
		"ttl": c.TTL, "refresh_ahead": c.RefreshAhead, "lock_ttl": c.LockTTL, "statement_timeout": c.StatementTimeout,
		"decay_half_life": c.DecayHalfLife, "history_half_life": c.HistoryHalfLife, "max_stale": c.MaxStale, "stale_ttl": c.StaleTTL,
		"tombstone_ttl": c.TombstoneTTL, "poll_interval": c.PollInterval, "reconcile_every": c.ReconcileEvery,
		"gather_window": c.GatherWindow, "pool_wait_timeout": c.PoolWaitTimeout, "lfu_check_every": c.LFUCheckEvery,
		"reconcile_trusted_every": c.ReconcileTrustedEvery,
	} {
		switch {
		case d < 0:
			bad(name, "%v is negative", d)
		case d > MaxDuration:
			bad(name, "%v is above the limit of %v (one year)", d, MaxDuration)
		}
	}
	if len(errs) > 0 {
		return c, errors.Join(errs...) // the defaults below are derived from these
	}
	if c.TTL == 0 {
		bad("ttl", "%v is not > 0", c.TTL)
	}
	if c.Jitter < 0 || c.Jitter > 1 || math.IsNaN(c.Jitter) {
		bad("jitter", "%v is outside [0,1]", c.Jitter)
	} else if _, ok := scaleDuration(c.TTL, 1+c.Jitter); !ok {
		bad("jitter", "ttl × (1 + %v) overflows", c.Jitter)
	}
	switch f := c.RefreshAheadFraction; {
	case f < 0 || f >= 1 || math.IsNaN(f):
		bad("refresh_ahead", "%g is not a fraction of the ttl in (0, 1) (for a duration write e.g. \"2s\")", f)
	case c.RefreshAhead == 0:
		if f == 0 {
			c.RefreshAheadFraction = DefaultRefreshAheadFraction
		}
		c.RefreshAhead, _ = scaleDuration(c.TTL, c.RefreshAheadFraction)
	}
	// Derived defaults are bounded like set values, once derived: a config that passes Resolve stays valid when
	// its effective values are written back and resolved again (validate shows them, run uses them).
	derived := func(field, how string, d time.Duration) {
		if d > MaxDuration {
			bad(field, "the default %s = %v is above the limit of %v (one year): set %s, or lower what it derives from",
				how, d, MaxDuration, field)
		}
	}
	// StatementTimeout first, then LockTTL from it (see LockTTL): never the other way round.
	if c.StatementTimeout == 0 {
		c.StatementTimeout = DefaultStatementTimeout
	}
	if c.LockTTL == 0 {
		two, ok := mulDuration(c.StatementTimeout, 2)
		if !ok {
			bad("lock_ttl", "the default 2 × statement_timeout (%v) overflows", c.StatementTimeout)
		}
		c.LockTTL = max(DefaultMinLockTTL, two)
		derived("lock_ttl", fmt.Sprintf("2 × statement_timeout (%v)", c.StatementTimeout), c.LockTTL)
	}
	if c.Keys != nil && !c.Keys.Stale.IsZero() && c.StaleTTL == 0 {
		st, ok := mulDuration(c.TTL, DefaultStaleTTLFactor)
		if !ok {
			bad("stale_ttl", "the default %d × ttl (%v) overflows", DefaultStaleTTLFactor, c.TTL)
		} else {
			derived("stale_ttl", fmt.Sprintf("%d × ttl (%v)", DefaultStaleTTLFactor, c.TTL), st)
		}
		c.StaleTTL = st
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.DecayHalfLife, DefaultDecayHalfLife)
	if c.HistoryHalfLife == 0 {
		h, ok := mulDuration(c.DecayHalfLife, DefaultHistoryFactor)
		if !ok || h > MaxDuration {
			h = MaxDuration // a long memory as long as allowed: clamped, since a valid decay_half_life must stay valid
		}
		c.HistoryHalfLife = max(h, time.Second)
	} else if c.HistoryHalfLife < time.Second {
		bad("history_half_life", "%v is below 1s: the long memory of reads ages in whole seconds", c.HistoryHalfLife)
	} else if c.HistoryHalfLife < c.DecayHalfLife {
		bad("history_half_life", "%v is below decay_half_life (%v): the long memory of reads must fade slower than the access scores",
			c.HistoryHalfLife, c.DecayHalfLife)
	}
	def(&c.MaxStale, DefaultMaxStale)
	def(&c.PollInterval, DefaultPollInterval)
	def(&c.ReconcileEvery, DefaultReconcileEvery)
	def(&c.ReconcileTrustedEvery, max(DefaultReconcileTrustedEvery, c.ReconcileEvery))
	if c.ReconcileTrustedEvery < c.ReconcileEvery {
		bad("reconcile_trusted_every", "%v is below reconcile_every (%v)", c.ReconcileTrustedEvery, c.ReconcileEvery)
	}
	switch {
	case c.ReconcileBudget == 0:
		c.ReconcileBudget = DefaultReconcileBudget
	case c.ReconcileBudget < 0:
		bad("reconcile_budget", "%d is negative", c.ReconcileBudget)
	}
	def(&c.GatherWindow, DefaultGatherWindow)
	def(&c.LFUCheckEvery, DefaultLFUCheckEvery)
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.MaxOriginConcurrency == 0 {
		c.MaxOriginConcurrency = DefaultMaxOriginConcurrency
	}
	topNOK := c.TopN >= 0 && c.TopN <= MaxTopN
	if !topNOK {
		bad("top_n", "%d is not in [0, %d] (0: pinned and scheduled keys only)", c.TopN, MaxTopN)
	} else if c.MaxTracked == 0 {
		c.MaxTracked = max(DefaultMaxTrackedFactor*c.TopN, DefaultMaxTracked)
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
		bad("lock_ttl", "%v must be longer than postgres.statement_timeout (%v): a rebuild may take that long and must not outlive its lock",
			c.LockTTL, c.StatementTimeout)
	}
	if c.StaleTTL > 0 && c.StaleTTL <= c.TTL {
		bad("stale_ttl", "%v must be longer than ttl (%v): the stale copy has to outlive the value", c.StaleTTL, c.TTL)
	}
	if c.BatchSize < 1 || c.BatchSize > MaxBatchSize {
		bad("batch_size", "%d is not in [1, %d]", c.BatchSize, MaxBatchSize)
	}
	if c.MaxOriginConcurrency < 1 {
		bad("max_origin_concurrency", "must be at least 1, got %d", c.MaxOriginConcurrency)
	}
	if c.MaxValueBytes < 0 || c.MaxValueBytes > MaxValueBytesLimit {
		bad("max_value_bytes", "%d is not in [0, %d] (0: no limit)", c.MaxValueBytes, MaxValueBytesLimit)
	}
	switch {
	case c.MaxTracked < 0:
		bad("max_tracked", "%d is negative", c.MaxTracked)
	case c.MaxTracked > MaxTrackedLimit:
		bad("max_tracked", "%d is above the limit of %d (the selection's memory is allocated for max_tracked ids at start)",
			c.MaxTracked, MaxTrackedLimit)
	case topNOK && c.MaxTracked < c.TopN:
		bad("max_tracked", "%d must be at least top_n (%d) and 1", c.MaxTracked, c.TopN)
	case c.MaxTracked < c.TopN+len(c.Pinned):
		c.MaxTracked = c.TopN + len(c.Pinned) // the pinned ids are always tracked
	}
	if c.OriginRate < 0 || math.IsNaN(c.OriginRate) {
		bad("origin_rate", "must be 0 (unlimited) or more, got %g", c.OriginRate)
	}
	if c.MinScore < 0 || math.IsNaN(c.MinScore) {
		bad("min_score", "must be 0 or more, got %g", c.MinScore)
	}
	switch c.Missing {
	case MissingDelete, MissingKeep:
	case MissingTombstone:
		if c.TombstoneTTL <= 0 {
			bad("tombstone_ttl", "%v is not > 0 (required with missing = \"tombstone\")", c.TombstoneTTL)
		}
	default:
		bad("missing", "%q is not a policy: want %q, %q or %q", c.Missing, MissingDelete, MissingKeep, MissingTombstone)
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

// queryBound is the client-side bound of one batch's origin query: the statement timeout plus a margin of a
// third of the lock TTL.
func (c KeyspaceConfig) queryBound() time.Duration { return c.StatementTimeout + c.LockTTL/3 }

// Bounds of the lease on the daemon's own rebuild locks (KeyspaceConfig.lease).
const (
	// minLease is the shortest lease: renewed every minLease/4 = 125 ms, it survives a renewal round trip of up
	// to a few hundred ms (and a lost renewal) on a loaded link, and costs at most 8 EVALSHA pipelines a second
	// per batch in flight, which most batches (one origin query, tens of ms) never reach.
	minLease = 500 * time.Millisecond
	// leaseLeadFraction: the lease is at most this fraction of the keyspace's smallest lead, so that the locks
	// of a replica that died (kill -9, a partition) lapse while the replicas that inherit its keys still have
	// most of the lead to refresh them: with the demo's 2 s lead, 500 ms, and the heir, which looks at a locked
	// key again within lead/8 (refresh.go), refreshes it about 1.25 s before it expires.
	leaseLeadFraction = 4
)

// Lease is the TTL of the daemon's own rebuild locks: min(LockTTL, max(minLease, Lead(0)/leaseLeadFraction)).
// Lead(0), the lead without a measured rebuild time, is the keyspace's smallest lead. A batch renews its leases
// every lease/4 from the acquisition until the release (pipeline.renewLeases), so a slow query is never cut
// short; renewals late by 3/4 of a lease are counted (lease_extensions_total{result="late"}), and the publish,
// token-checked, writes nothing through a lock that lapsed. LockTTL keeps its meaning for apps (their locks,
// SET NX PX lock_ttl), and bounds the lease from above. Call it on a config returned by New's validation (or
// Resolve).
func (c KeyspaceConfig) Lease() time.Duration {
	return min(c.LockTTL, max(minLease, c.Lead(0)/leaseLeadFraction))
}

// originBound is the longest one refresh may take by the config: the wait for an origin connection plus the
// statement timeout.
func (c KeyspaceConfig) originBound() time.Duration { return c.StatementTimeout + c.PoolWaitTimeout }

// Lead is how long before its expiry a hot key whose rebuilds take rebuildP95 (0: not measured yet) is
// refreshed: the largest of RefreshAhead, LeadMultiple × rebuildP95 and StatementTimeout + PoolWaitTimeout, capped
// at TTL × MaxLeadFraction. This is the one definition of the lead; the scheduler, the re-check under the lock,
// the short-notice test and the fail-safe all use it. Call it on a config returned by New's validation.
func (c KeyspaceConfig) Lead(rebuildP95 time.Duration) time.Duration {
	m, ok := scaleDuration(rebuildP95, c.LeadMultiple)
	if !ok {
		return c.maxLead() // a product that overflows is past any cap
	}
	return min(max(c.RefreshAhead, c.originBound(), m), c.maxLead())
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

// withDefaults is Resolve plus the checks that need the origin.
func (c KeyspaceConfig) withDefaults() (KeyspaceConfig, error) {
	c, err := c.Resolve()
	if c.Src == nil {
		err = errors.Join(err, &FieldError{Keyspace: c.Name, Field: "source", Msg: "is nil"})
	}
	if v, ok := c.Src.(IDValidator); ok {
		for _, id := range c.Pinned {
			if verr := v.ValidID(id); verr != nil {
				err = errors.Join(err, &FieldError{Keyspace: c.Name, Field: "pinned", Msg: verr.Error()})
			}
		}
	}
	return c, err
}
