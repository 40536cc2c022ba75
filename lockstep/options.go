package lockstep

import (
	"log/slog"
	"math"
	"math/rand/v2"
	"time"
)

// Defaults of a Client's options.
const (
	// DefaultLockTTL is the default lease of a rebuild lock (WithLockTTL). A loader gets this long; a publish after
	// it returns ErrLockLost. keepwarm's daemon has its own default for a keyspace's lock_ttl, longer because its
	// lock must outlive a batch query bounded by the statement timeout (warmer.DefaultMinLockTTL, 10 s); an app
	// sharing a keyspace with it passes that keyspace's lock_ttl to WithLockTTL.
	DefaultLockTTL = 5 * time.Second
	// DefaultRedisTimeout bounds every Redis round trip of a Client (WithRedisTimeout), whatever the caller's
	// context allows: a Get whose context has no deadline still fails in bounded time when Redis stops answering.
	DefaultRedisTimeout = time.Second
	// DefaultAccessFlushInterval is how often sampled access counts are flushed to Redis (WithAccessFlushInterval).
	DefaultAccessFlushInterval = time.Second
	// DefaultAccessMaxPending is the most distinct ids buffered between flushes; more trigger an early flush and
	// are dropped until it has run.
	DefaultAccessMaxPending = 10000
	// DefaultAccessKeyPrefix prefixes the sorted set of read counts that keepwarm's daemon tracks: the key is
	// DefaultAccessKeyPrefix + keyspace, members are ids, scores are (estimated) read counts.
	DefaultAccessKeyPrefix = "keepwarm:access:"
)

// AccessKey returns the key of keyspace's access sorted set: DefaultAccessKeyPrefix + keyspace.
func AccessKey(keyspace string) string { return DefaultAccessKeyPrefix + keyspace }

// Backoff is how a follower waits for another process's rebuild: it polls the cache key after Initial, then after
// each previous sleep × Multiplier, each sleep at most Max, until Total has passed; then it serves the stale copy
// or returns ErrRebuildTimeout. A zero field takes its default from DefaultBackoff.
type Backoff struct {
	Initial    time.Duration // first sleep; default 50ms
	Multiplier float64       // growth per poll, ≥ 1; default 1.5
	Max        time.Duration // longest sleep; default 200ms
	Total      time.Duration // whole wait budget; default 2s
}

// DefaultBackoff is the follower wait of a Client without WithWait: 50ms, ×1.5, at most 200ms, 2s in total.
var DefaultBackoff = Backoff{Initial: 50 * time.Millisecond, Multiplier: 1.5, Max: 200 * time.Millisecond, Total: 2 * time.Second}

type config struct {
	jitter        float64
	lockTTL       time.Duration
	redisTimeout  time.Duration
	staleTTL      time.Duration
	backoff       Backoff
	xfetchBeta    float64 // 0: off
	meta          bool    // write the meta hash beside each value (WithMeta)
	sampleRate    float64 // 0: off
	flushInterval time.Duration
	maxPending    int
	recorder      Recorder
	logger        *slog.Logger
	rand          func() float64
	now           func() time.Time // nil: time.Now (WithClock)
	near          *NearCache       // nil: off (WithNearCache)
}

func defaultConfig() config {
	return config{
		jitter:        DefaultJitter,
		lockTTL:       DefaultLockTTL,
		redisTimeout:  DefaultRedisTimeout,
		backoff:       DefaultBackoff,
		flushInterval: DefaultAccessFlushInterval,
		maxPending:    DefaultAccessMaxPending,
		recorder:      NopRecorder{},
		logger:        slog.Default(),
		rand:          rand.Float64,
	}
}

// Option configures a Client (see New). Options validate their argument; New returns the error, wrapping
// ErrInvalidArgument and naming the option's argument.
type Option func(*config) error

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// WithJitter sets the TTL jitter fraction, in [0, 1] (default DefaultJitter = 0.1): each write's TTL is
// Jitter(ttl, jitter, u), i.e. in [ttl, ttl×(1+jitter)).
func WithJitter(jitter float64) Option {
	return func(c *config) error {
		if !finite(jitter) || jitter < 0 || jitter > 1 {
			return argError("jitter", "%v is outside [0, 1]", jitter)
		}
		c.jitter = jitter
		return nil
	}
}

// WithLockTTL sets the lease of the rebuild lock, > 0 (default DefaultLockTTL = 5s). It bounds the loader: its
// context ends when the lock would expire, and a publish after that returns ErrLockLost.
func WithLockTTL(ttl time.Duration) Option {
	return func(c *config) error {
		if ttl <= 0 {
			return argError("lock ttl", "%v is not > 0", ttl)
		}
		c.lockTTL = ttl
		return nil
	}
}

// WithRedisTimeout bounds each Redis round trip of the Client (a GET, a pipeline, a script call) to d, > 0
// (default DefaultRedisTimeout = 1s); a caller's earlier context deadline still wins. A call that hits the bound
// fails with an error wrapping ErrRedisTimeout and context.DeadlineExceeded. The bound holds even when the
// go-redis client ignores context deadlines (ContextTimeoutEnabled false, its default): the Client then runs each
// call in a goroutine of its own (about 10 more allocations per Get), stops waiting at the bound, and leaves the
// call to finish under go-redis's own ReadTimeout. With ContextTimeoutEnabled true (recommended) the call runs
// inline and go-redis itself ends it at the bound. Choose d above Redis's
// slowest healthy round trip (p99.9 plus a margin): a Get's worst case is a few multiples of it (see Client.Get).
func WithRedisTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return argError("redis timeout", "%v is not > 0", d)
		}
		c.redisTimeout = d
		return nil
	}
}

// WithStale makes every rebuild also write the stale copy (the Keys' stale template must be set) with this TTL,
// > 0; it should be well above the cache TTL, e.g. 24h for a 5m cache. Without it the Client still serves a stale
// copy that someone else (the daemon, another app) wrote, but never writes one.
func WithStale(ttl time.Duration) Option {
	return func(c *config) error {
		if ttl <= 0 {
			return argError("stale ttl", "%v is not > 0", ttl)
		}
		c.staleTTL = ttl
		return nil
	}
}

// WithWait sets how followers wait for another process's rebuild (default DefaultBackoff). Zero fields keep
// their defaults; negative durations or a Multiplier below 1 are errors.
func WithWait(b Backoff) Option {
	return func(c *config) error {
		d := DefaultBackoff
		switch {
		case b.Initial < 0:
			return argError("wait: initial", "%v is negative", b.Initial)
		case b.Max < 0:
			return argError("wait: max", "%v is negative", b.Max)
		case b.Total < 0:
			return argError("wait: total", "%v is negative", b.Total)
		case b.Multiplier != 0 && (!finite(b.Multiplier) || b.Multiplier < 1):
			return argError("wait: multiplier", "%v is below 1", b.Multiplier)
		}
		if b.Initial > 0 {
			d.Initial = b.Initial
		}
		if b.Multiplier != 0 {
			d.Multiplier = b.Multiplier
		}
		if b.Max > 0 {
			d.Max = b.Max
		}
		if b.Total > 0 {
			d.Total = b.Total
		}
		if d.Max < d.Initial {
			d.Max = d.Initial
		}
		c.backoff = d
		return nil
	}
}

// WithXFetch turns on XFetch early refresh with eagerness beta (> 0; 1 is the paper's choice, larger refreshes
// earlier). A hit then also reads the key's remaining TTL in the same round trip (PTTL pipelined with GET), and
// when XFetch says so, refreshes the value in the background under the lock (skipped when the lock is held) while
// the hit is returned at once. δ is the rebuild time this Client measured itself (a decayed maximum of its
// loader's durations); with WithMeta(true) the meta hash's δ is read in the same round trip and preferred when
// present. Until this Client has rebuilt a value once and with no δ in Redis, XFetch does not fire (the value
// then simply expires). See XFetch (Vattani et al., VLDB 2015).
func WithXFetch(beta float64) Option {
	return func(c *config) error {
		if !finite(beta) || beta <= 0 {
			return argError("xfetch beta", "%v is not > 0", beta)
		}
		c.xfetchBeta = beta
		return nil
	}
}

// WithMeta sets whether each write also keeps the meta hash (MetaWrittenField, MetaDeltaField) beside the value.
// The default is false: measured on Redis 7, the hash added 38% to the memory of a 314-byte cached value (see
// docs/benchmarks.md), and XFetch works without it on the Client's own rebuild time. Turn it on when other
// readers need δ from Redis (apps in other languages that read delta_ms, or Clients that never rebuild). Without
// it, a write deletes any meta hash left by an older write (Write.NoMeta).
func WithMeta(on bool) Option {
	return func(c *config) error {
		c.meta = on
		return nil
	}
}

// WithAccessRecording feeds keepwarm's hot-key tracking: each Get is sampled with probability sampleRate, in
// (0, 1], and a sampled read adds 1/sampleRate to the id's score in the sorted set AccessKey(keyspace). Counts are
// batched in memory and flushed off the request path every DefaultAccessFlushInterval (WithAccessFlushInterval)
// in one pipelined round trip of ZINCRBY, and once more on Close.
func WithAccessRecording(sampleRate float64) Option {
	return func(c *config) error {
		if !finite(sampleRate) || sampleRate <= 0 || sampleRate > 1 {
			return argError("access sample rate", "%v is outside (0, 1]", sampleRate)
		}
		c.sampleRate = sampleRate
		return nil
	}
}

// WithAccessFlushInterval sets how often sampled access counts are flushed, > 0 (default
// DefaultAccessFlushInterval = 1s). It has no effect without WithAccessRecording.
func WithAccessFlushInterval(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return argError("access flush interval", "%v is not > 0", d)
		}
		c.flushInterval = d
		return nil
	}
}

// WithRecorder sets where the Client reports hits, misses, rebuilds and waits (default NopRecorder). r must not
// be nil.
func WithRecorder(r Recorder) Option {
	return func(c *config) error {
		if r == nil {
			return argError("recorder", "nil")
		}
		c.recorder = r
		return nil
	}
}

// WithLogger sets the logger (default slog.Default()). Expected outcomes (lock held elsewhere, lock lost) log at
// Debug; failures nobody else sees (a background refresh, a release or an access flush that failed) at Warn.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return argError("logger", "nil")
		}
		c.logger = l
		return nil
	}
}

// WithRand sets the source of uniform random numbers in [0, 1) used for TTL jitter, XFetch and access sampling
// (default math/rand/v2.Float64). Tests pass a seeded generator to make those decisions reproducible. f is called
// concurrently, so it must be safe for concurrent use (wrap a *rand.Rand in a mutex).
func WithRand(f func() float64) Option {
	return func(c *config) error {
		if f == nil {
			return argError("rand", "nil")
		}
		c.rand = f
		return nil
	}
}
