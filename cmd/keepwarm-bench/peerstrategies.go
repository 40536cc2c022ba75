package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	gocache "github.com/go-redis/cache/v9"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/viccon/sturdyc"

	"github.com/keepwarm/keepwarm/internal/assemble"
	"github.com/keepwarm/keepwarm/internal/benchload"
	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/warmer"
)

// peerStrategy is one row group of the peers benchmark: a library, configured as its README recommends for a
// read-through cache with a TTL, with every early-refresh or stampede option it has turned on. The harness
// (peersEnv.runCell) runs every strategy alike; adding one is adding an entry to peerStrategies.
type peerStrategy struct {
	name    string
	library string // module and version, as go.mod pins it
	// config describes the configuration for c, for the printed output and the JSON.
	config func(c peersConfig) string
	// start sets up r.n instances, each with its own Redis client and PostgreSQL pool, for one cell.
	start func(ctx context.Context, r *peerRun) (*peerSetup, error)
}

// peerStrategies are the strategies of `keepwarm-bench peers`, in the order "all" runs them.
var peerStrategies = []peerStrategy{
	{"sturdyc", "github.com/viccon/sturdyc v1.1.5", sturdycConfig, sturdycStrategy},
	{"go-redis-cache", "github.com/go-redis/cache/v9 v9.0.0", goRedisCacheConfig, goRedisCacheStrategy},
	{"redislock", "github.com/bsm/redislock v0.9.4", lockedConfig("redislock"), lockedStrategy(redislockLocker)},
	{"redsync", "github.com/go-redsync/redsync/v4 v4.18.1", lockedConfig("redsync"), lockedStrategy(redsyncLocker)},
	{"lockstep", "lockstep (this module), no daemon", lockstepConfig(lockstepMode{}), lockstepPeer(lockstepMode{})},
	{"keepwarm", "lockstep + the keepwarm warmer (in-process)", lockstepConfig(lockstepMode{daemon: true}), lockstepPeer(lockstepMode{daemon: true})},
	{"keepwarm-defaults", "lockstep + the keepwarm warmer (in-process) at the shipped refresh_ahead and top_n", lockstepConfig(lockstepMode{daemon: true, defaults: true}),
		lockstepPeer(lockstepMode{daemon: true, defaults: true})},
	{"lockstep+near", "lockstep (this module) with its near cache, no daemon", lockstepConfig(lockstepMode{near: true}), lockstepPeer(lockstepMode{near: true})},
	{"lockstep+near+keepwarm", "lockstep with its near cache + the keepwarm warmer (in-process)", lockstepConfig(lockstepMode{near: true, daemon: true}),
		lockstepPeer(lockstepMode{near: true, daemon: true})},
}

// hasDaemon reports whether the strategy runs the keepwarm daemon's warmer beside its apps: the rows whose name
// contains "keepwarm" (lockstepPeer with lockstepMode.daemon).
func (st peerStrategy) hasDaemon() bool { return strings.Contains(st.name, "keepwarm") }

// peerByName returns the peer strategy called name.
func peerByName(name string) (peerStrategy, bool) {
	for _, st := range peerStrategies {
		if st.name == name {
			return st, true
		}
	}
	return peerStrategy{}, false
}

// peerRun is what the harness gives a strategy's start for one cell.
type peerRun struct {
	*peersEnv
	name   string
	prefix string // every key the strategy writes contains it
	n      int    // instances
	origin *originCounter
}

// peerInstance is one app instance: read returns id's value (the origin's bytes) as the app would see it.
// read is called from several goroutines at once.
type peerInstance struct {
	read func(ctx context.Context, id string) ([]byte, error)
}

// peerSetup is a strategy set up for one cell.
type peerSetup struct {
	instances []peerInstance
	// near counts the near-cache rows' near hits and bypasses, all instances together; nil in the other rows.
	near *nearCount
	// stop, when set, stops what runs in the background (the warmer) and returns its refreshes by result.
	stop func() map[string]int64
	// closers release the instances' clients and pools, in order.
	closers []func()
}

// nearCount is a lockstep Recorder (and NearRecorder) that counts near hits and bypasses only.
type nearCount struct{ hits, bypasses atomic.Int64 }

func (*nearCount) Hit(string)                            {}
func (*nearCount) Miss(string)                           {}
func (*nearCount) StaleServe(string)                     {}
func (*nearCount) Rebuild(string, time.Duration, string) {}
func (*nearCount) LockContention(string)                 {}
func (*nearCount) Wait(string, time.Duration, string)    {}
func (*nearCount) EarlyRefresh(string)                   {}
func (n *nearCount) NearHit(string)                      { n.hits.Add(1) }
func (n *nearCount) NearBypass(string)                   { n.bypasses.Add(1) }
func (*nearCount) NearInvalidation(string)               {}
func (*nearCount) NearBytes(string, int64)               {}

var _ lockstep.NearRecorder = (*nearCount)(nil)

// snapshot returns the counts so far; nil-safe (0, 0).
func (n *nearCount) snapshot() (hits, bypasses int64) {
	if n == nil {
		return 0, 0
	}
	return n.hits.Load(), n.bypasses.Load()
}

// finish calls stop once; later calls return nil.
func (s *peerSetup) finish() map[string]int64 {
	if s.stop == nil {
		return nil
	}
	stop := s.stop
	s.stop = nil
	return stop()
}

// release stops the strategy if the harness has not, then closes it; later calls do nothing.
func (s *peerSetup) release() {
	s.finish()
	for _, f := range s.closers {
		f()
	}
	s.closers = nil
}

// conns opens one instance's own Redis client (go-redis's default pool) and PostgreSQL pool, and registers their
// closing on s.
func (r *peerRun) conns(ctx context.Context, s *peerSetup) (*redis.Client, *pgxpool.Pool, error) {
	rdb, err := benchload.NewRedis(ctx, r.url, 0)
	if err != nil {
		return nil, nil, err
	}
	rdb.AddHook(firstGetHook{})
	s.closers = append(s.closers, func() { _ = rdb.Close() })
	pool, err := benchload.NewPool(ctx, r.c.postgresURL, int32(r.c.pgConns))
	if err != nil {
		return nil, nil, err
	}
	s.closers = append(s.closers, pool.Close)
	return rdb, pool, nil
}

// instances builds r.n instances with one, releasing what was built when one fails.
func (r *peerRun) instances(ctx context.Context, one func(ctx context.Context, s *peerSetup, i int) (peerInstance, error)) (*peerSetup, error) {
	s := &peerSetup{}
	for i := range r.n {
		in, err := one(ctx, s, i)
		if err != nil {
			s.release()
			return nil, err
		}
		s.instances = append(s.instances, in)
	}
	return s, nil
}

// appLoader returns an instance's origin loader on pool: the strategy's counted query for one id.
func (r *peerRun) appLoader(pool *pgxpool.Pool) (lockstep.Loader, error) {
	src, err := r.source(pool, r.origin, r.name, false)
	if err != nil {
		return nil, err
	}
	return benchload.LoaderOf(src), nil
}

// app is one app instance's connections and origin: its own Redis client and pool (conns), and the loader that
// queries the origin through that pool (appLoader).
func (r *peerRun) app(ctx context.Context, s *peerSetup) (*redis.Client, lockstep.Loader, error) {
	rdb, pool, err := r.conns(ctx, s)
	if err != nil {
		return nil, nil, err
	}
	load, err := r.appLoader(pool)
	if err != nil {
		return nil, nil, err
	}
	return rdb, load, nil
}

// --- sturdyc -----------------------------------------------------------------------------------------------------

// sturdycKnobs maps the TTL onto sturdyc's knobs in the proportions of the README's "Distributed storage early
// refreshes" section and its example, examples/distributed-early-refreshes (records refreshed from the origin
// once Redis's copy is older than refreshAfter = 1 minute, Redis TTL "something like an hour", in-memory ttl 5
// minutes, in-memory refreshes every 2-4 s, synchronous after 30 s, refresh coalescing with a buffer of 3 ids
// or 2 s, reads through GetOrFetchBatch), with refreshAfter = the TTL: the origin is asked when the shared copy
// is a TTL old, as a Redis TTL would make the other strategies ask. In memory: a read after [ttl/10, ttl/5)
// since the last refresh schedules a background refresh (from Redis, or from the origin when Redis's copy is
// older than refreshAfter), buffered until 3 ids or ttl/10 (the example's buffer timeout equals its shortest
// refresh delay) and fetched as one batch; a read after ttl/2 refreshes synchronously; an unread record leaves
// memory after 5×ttl. Redis keeps records 60×ttl.
type sturdycKnobs struct {
	memTTL, minAsync, maxAsync, sync, refreshAfter, storageTTL time.Duration
	bufferSize                                                 int
	bufferTimeout                                              time.Duration
}

func sturdycKnobsFor(ttl time.Duration) sturdycKnobs {
	return sturdycKnobs{memTTL: 5 * ttl, minAsync: ttl / 10, maxAsync: ttl / 5, sync: ttl / 2, refreshAfter: ttl, storageTTL: 60 * ttl,
		bufferSize: 3, bufferTimeout: ttl / 10}
}

func sturdycConfig(c peersConfig) string {
	k := sturdycKnobsFor(c.ttl)
	return fmt.Sprintf("sturdyc.New[[]byte](capacity %d (every id), 10 shards, ttl %v, evict 10%%, WithEarlyRefreshes(%v, %v, sync %v, retry 100ms), "+
		"WithRefreshCoalescing(%d, %v), "+
		"WithDistributedStorageEarlyRefreshes(Redis GET/SET PX %v×(1+U·%g), MGET, pipelined SET, DEL; refreshAfter %v), WithNoContinuousEvictions "+
		"(capacity is never reached; without it each client's eviction goroutine never exits)); GetOrFetchBatch([id], BatchKeyFn, one origin query for the ids asked) per read, "+
		"as the README's example for this mode; values live in process memory, Redis holds sturdyc's JSON record {created_at, value}; no cross-process lock",
		c.keys, k.memTTL, k.minAsync, k.maxAsync, k.sync, k.bufferSize, k.bufferTimeout, k.storageTTL, c.jitter, k.refreshAfter)
}

func sturdycStrategy(ctx context.Context, r *peerRun) (*peerSetup, error) {
	c := r.c
	k := sturdycKnobsFor(c.ttl)
	return r.instances(ctx, func(ctx context.Context, s *peerSetup, _ int) (peerInstance, error) {
		rdb, pool, err := r.conns(ctx, s)
		if err != nil {
			return peerInstance{}, err
		}
		src, err := r.source(pool, r.origin, r.name, false)
		if err != nil {
			return peerInstance{}, err
		}
		storage := &sturdycRedis{rdb: rdb, ttl: k.storageTTL, jitter: c.jitter}
		cache := sturdyc.New[[]byte](c.keys, 10, k.memTTL, 10,
			sturdyc.WithEarlyRefreshes(k.minAsync, k.maxAsync, k.sync, 100*time.Millisecond),
			sturdyc.WithRefreshCoalescing(k.bufferSize, k.bufferTimeout),
			sturdyc.WithDistributedStorageEarlyRefreshes(storage, k.refreshAfter),
			sturdyc.WithNoContinuousEvictions(),
			sturdyc.WithLog(&sturdyc.NoopLogger{}))
		keyFn := cache.BatchKeyFn(r.prefix + "s")
		fetch := func(ctx context.Context, ids []string) (map[string][]byte, error) {
			vals, _, err := src.Fetch(ctx, ids) // an id left out is missing: sturdyc deletes it
			return vals, err
		}
		return peerInstance{read: func(ctx context.Context, id string) ([]byte, error) {
			vals, err := cache.GetOrFetchBatch(ctx, []string{id}, keyFn, fetch)
			if err != nil {
				return nil, err
			}
			v, ok := vals[id]
			if !ok {
				return nil, fmt.Errorf("id %s: %w", id, sturdyc.ErrNotFound)
			}
			return v, nil
		}}, nil
	})
}

// sturdycRedis is sturdyc's DistributedStorageWithDeletions on one instance's Redis client. sturdyc leaves TTLs
// to the storage: every write gets ttl with jitter. Errors other than a missing key count as a miss of
// the storage, as the interface has no error results.
type sturdycRedis struct {
	rdb    *redis.Client
	ttl    time.Duration
	jitter float64
}

func (s *sturdycRedis) Get(ctx context.Context, key string) ([]byte, bool) {
	b, err := s.rdb.Get(ctx, key).Bytes()
	return b, err == nil
}

func (s *sturdycRedis) Set(ctx context.Context, key string, value []byte) {
	s.rdb.Set(ctx, key, value, jitterTTL(s.ttl, s.jitter))
}

func (s *sturdycRedis) GetBatch(ctx context.Context, keys []string) map[string][]byte {
	out := map[string][]byte{}
	vals, err := s.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return out
	}
	for i, v := range vals {
		if str, ok := v.(string); ok {
			out[keys[i]] = []byte(str)
		}
	}
	return out
}

func (s *sturdycRedis) SetBatch(ctx context.Context, records map[string][]byte) {
	_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k, v := range records {
			p.Set(ctx, k, v, jitterTTL(s.ttl, s.jitter))
		}
		return nil
	})
}

func (s *sturdycRedis) Delete(ctx context.Context, key string) { s.rdb.Del(ctx, key) }

func (s *sturdycRedis) DeleteBatch(ctx context.Context, keys []string) { s.rdb.Del(ctx, keys...) }

// --- go-redis/cache ---------------------------------------------------------------------------------------------

// goRedisCacheLocalTTL is the local TinyLFU's TTL: the README pairs a 1-minute local TTL with 1-hour items
// (NewTinyLFU(1000, time.Minute)); kept at a tenth of the item TTL here, so that a local copy adds at most about
// 10% to a value's age.
func goRedisCacheLocalTTL(ttl time.Duration) time.Duration { return ttl / 10 }

func goRedisCacheConfig(c peersConfig) string {
	return fmt.Sprintf("cache.New(&cache.Options{Redis: the instance's client, LocalCache: cache.NewTinyLFU(%d, %v)}) (TinyLFU adds up to 10%% to its TTL); "+
		"Once(&cache.Item{Key, Value: &[]byte, TTL: ttl×(1+U·%g) with ttl %v, Do: the origin query}) per read: local cache, then Redis GET, "+
		"then Do under the process's singleflight and SET; no early refresh exists in the library", c.keys, goRedisCacheLocalTTL(c.ttl), c.jitter, c.ttl)
}

func goRedisCacheStrategy(ctx context.Context, r *peerRun) (*peerSetup, error) {
	c := r.c
	return r.instances(ctx, func(ctx context.Context, s *peerSetup, _ int) (peerInstance, error) {
		rdb, load, err := r.app(ctx, s)
		if err != nil {
			return peerInstance{}, err
		}
		cache := gocache.New(&gocache.Options{Redis: rdb, LocalCache: gocache.NewTinyLFU(c.keys, goRedisCacheLocalTTL(c.ttl))})
		prefix := r.prefix
		return peerInstance{read: func(ctx context.Context, id string) ([]byte, error) {
			var v []byte
			err := cache.Once(&gocache.Item{Ctx: ctx, Key: prefix + id, Value: &v, TTL: jitterTTL(c.ttl, c.jitter),
				Do: func(it *gocache.Item) (any, error) { return load(it.Context(), id) }})
			return v, err
		}}, nil
	})
}

// --- redislock and redsync around cache-aside -------------------------------------------------------------------

// locker takes a key's lock once, without waiting: unlock releases it; ok false means another holder has it.
type locker func(ctx context.Context, key string, ttl time.Duration) (unlock func(), ok bool, err error)

func lockedConfig(lib string) func(c peersConfig) string {
	return func(c peersConfig) string {
		how := "redislock.New(client).Obtain(ctx, lock key, lock TTL, nil) (one try: the default NoRetry), Release"
		if lib == "redsync" {
			how = "redsync.New(goredis.NewPool(client)).NewMutex(lock key, WithExpiry(lock TTL), WithTries(1)).TryLockContext, UnlockContext"
		}
		return fmt.Sprintf("cache-aside: GET; on a miss %s; the holder GETs again, queries the origin and SETs with TTL ttl×(1+U·%g), ttl %v; "+
			"a reader that finds the lock held sleeps %v and GETs again until the value is there (lock TTL %v); nothing in process memory",
			how, c.jitter, c.ttl, lockPoll, c.lockTTL)
	}
}

func redislockLocker(rdb *redis.Client) locker {
	l := redislock.New(rdb)
	return func(ctx context.Context, key string, ttl time.Duration) (func(), bool, error) {
		lock, err := l.Obtain(ctx, key, ttl, nil)
		switch {
		case errors.Is(err, redislock.ErrNotObtained):
			return nil, false, nil
		case err != nil:
			return nil, false, err
		}
		return func() { _ = lock.Release(context.WithoutCancel(ctx)) }, true, nil
	}
}

func redsyncLocker(rdb *redis.Client) locker {
	rs := redsync.New(redsyncgoredis.NewPool(rdb))
	return func(ctx context.Context, key string, ttl time.Duration) (func(), bool, error) {
		m := rs.NewMutex(key, redsync.WithExpiry(ttl), redsync.WithTries(1))
		if err := m.TryLockContext(ctx); err != nil {
			var re *redsync.RedisError
			if errors.As(err, &re) {
				return nil, false, err
			}
			return nil, false, nil // taken (ErrTaken, ErrNodeTaken) or failed the quorum: held elsewhere
		}
		return func() { _, _ = m.UnlockContext(context.WithoutCancel(ctx)) }, true, nil
	}
}

// errGaveUp is a locked read that waited a whole lock TTL without the value appearing.
var errGaveUp = errors.New("gave up waiting for the value")

func lockedStrategy(newLocker func(*redis.Client) locker) func(context.Context, *peerRun) (*peerSetup, error) {
	return func(ctx context.Context, r *peerRun) (*peerSetup, error) {
		c := r.c
		return r.instances(ctx, func(ctx context.Context, s *peerSetup, _ int) (peerInstance, error) {
			rdb, load, err := r.app(ctx, s)
			if err != nil {
				return peerInstance{}, err
			}
			lock := newLocker(rdb)
			prefix := r.prefix
			get := func(ctx context.Context, key string) ([]byte, bool, error) {
				v, err := rdb.Get(ctx, key).Bytes()
				if errors.Is(err, redis.Nil) {
					return nil, false, nil
				}
				return v, err == nil, err
			}
			return peerInstance{read: func(ctx context.Context, id string) ([]byte, error) {
				key, lockKey := prefix+"v:"+id, prefix+"lock:"+id
				if v, ok, err := get(ctx, key); ok || err != nil {
					return v, err
				}
				for deadline := time.Now().Add(c.lockTTL); ; {
					unlock, ok, err := lock(ctx, lockKey, c.lockTTL)
					if err != nil {
						return nil, err
					}
					if ok {
						defer unlock()
						if v, ok, err := get(ctx, key); ok || err != nil { // filled while we took the lock
							return v, err
						}
						v, err := load(ctx, id)
						if err != nil {
							return nil, err
						}
						return v, rdb.Set(ctx, key, v, jitterTTL(c.ttl, c.jitter)).Err()
					}
					if !sleepCtx(ctx, lockPoll) {
						return nil, ctx.Err()
					}
					if v, ok, err := get(ctx, key); ok || err != nil {
						return v, err
					}
					if time.Now().After(deadline) {
						return nil, errGaveUp
					}
				}
			}}, nil
		})
	}
}

// --- lockstep, alone and with the daemon ----------------------------------------------------------------------

// lockstepMode is which lockstep row: with the daemon's warmer, with the near cache, with the daemon at the
// shipped defaults of refresh_ahead and top_n (daemonTOML).
type lockstepMode struct {
	daemon, near, defaults bool
}

// nearCacheFor is the near cache of the near rows: 64 MiB and a hard age bound of ttl/2 (docs/protocol.md
// §7.2's example, 64 MiB and 5s, at the default 10s TTL), MaxLag at its default.
func nearCacheFor(ttl time.Duration) lockstep.NearCache {
	return lockstep.NearCache{MaxBytes: 64 << 20, MaxStaleness: ttl / 2}
}

// lockstepConfig describes the README's options ("Using lockstep in an application"): jitter, a stale copy of 10
// minutes, XFetch β = 1, and with the daemon access recording, at 1 rather than the README's 0.1: the counts are
// batched per id per flush, so sampling saves little Redis work here, and full counts let the daemon learn the
// hot set within a few polls rather than a few TTLs. With the near cache, XFetch is off: lockstep refuses the two
// together (XFetch decides on reads that reach Redis, and near hits would hide them).
func lockstepConfig(m lockstepMode) func(c peersConfig) string {
	return func(c peersConfig) string {
		s := fmt.Sprintf("lockstep.New(client, keyspace, keys, load, ttl %v, WithJitter(%g), WithStale(10m), ", c.ttl, c.jitter)
		if m.near {
			n := nearCacheFor(c.ttl)
			s += fmt.Sprintf("WithNearCache(NearCache{MaxBytes: %s, MaxStaleness: %v, MaxLag: %v (the default)}) (no XFetch: lockstep refuses it with a near cache), ",
				bytesIEC(float64(n.MaxBytes)), n.MaxStaleness, lockstep.DefaultNearMaxLag)
		} else {
			s += "WithXFetch(1), "
		}
		s += fmt.Sprintf("WithLockTTL(%v)", c.lockTTL)
		if !m.daemon {
			if m.near {
				return s + "); hot values in process memory, invalidated by Redis (broadcast tracking on one connection of its own per instance)"
			}
			return s + "); nothing in process memory"
		}
		return s + ", WithAccessRecording(1): counts are batched per flush, so sampling saves little, and the daemon learns the hot set within a few polls); " +
			"the daemon's warmer in-process, built by internal/config and internal/assemble from this config file, as `keepwarm run` builds it: " +
			strings.Join(strings.Fields(daemonTOML(c, !m.defaults, "<cell>", "<cell prefix>v:${id}", "<redis url>", "<postgres url>", "<the origin query on peers_v_keepwarm_daemon>", "auto")), " ")
	}
}

func lockstepPeer(m lockstepMode) func(context.Context, *peerRun) (*peerSetup, error) {
	return func(ctx context.Context, r *peerRun) (*peerSetup, error) {
		c := r.c
		keyTemplate := r.prefix + "v:${id}"
		keys, err := lockstep.NewKeys(keyTemplate, "", lockstep.DefaultStaleTemplate, "")
		if err != nil {
			return nil, err
		}
		ksName := "kwbench-peers-" + r.run + "-" + strings.ReplaceAll(r.name, "+", "-") + "-" + fmt.Sprint(r.n)
		var near *nearCount
		if m.near {
			near = &nearCount{}
		}
		s, err := r.instances(ctx, func(ctx context.Context, s *peerSetup, _ int) (peerInstance, error) {
			rdb, load, err := r.app(ctx, s)
			if err != nil {
				return peerInstance{}, err
			}
			opts := []lockstep.Option{lockstep.WithJitter(c.jitter), lockstep.WithStale(10 * time.Minute),
				lockstep.WithLockTTL(c.lockTTL), lockstep.WithLogger(r.log)}
			if m.near {
				opts = append(opts, lockstep.WithNearCache(nearCacheFor(c.ttl)), lockstep.WithRecorder(near))
			} else {
				opts = append(opts, lockstep.WithXFetch(1))
			}
			if m.daemon {
				opts = append(opts, lockstep.WithAccessRecording(1))
			}
			cl, err := lockstep.New(rdb, ksName, keys, load, c.ttl, opts...)
			if err != nil {
				return peerInstance{}, err
			}
			// Closed before its client (closers run in order, and the client's closer is already in): prepend.
			s.closers = append([]func(){func() { _ = cl.Close(context.WithoutCancel(ctx)) }}, s.closers...)
			return peerInstance{read: cl.Get}, nil
		})
		if err != nil {
			return nil, err
		}
		s.near = near
		s.closers = append(s.closers, func() {
			bg := context.WithoutCancel(ctx)
			r.ctl.Del(bg, lockstep.AccessKey(ksName), "keepwarm:decay:"+ksName)
			deletePrefix(r.ctl, ksName)
		})
		if !m.daemon {
			return s, nil
		}
		w, err := r.daemon(ctx, s, !m.defaults, ksName, keyTemplate)
		if err != nil {
			s.release()
			return nil, err
		}
		stopWarmer := startWarmer(context.WithoutCancel(ctx), w)
		s.stop = func() map[string]int64 {
			var refreshes map[string]int64
			for _, st := range w.Status(0) {
				refreshes = st.Refreshes
			}
			stopWarmer()
			return refreshes
		}
		return s, nil
	}
}

// daemonTOML is the keepwarm config file of a row's daemon: keyspace ks with cache key template key (the apps'),
// Redis url, PostgreSQL dsn, the origin query, notifications mode. statement_timeout and pool_wait_timeout are
// short on purpose (docs/benchmarks.md §12): the lead is never less than their sum. Tuned, the keyspace takes
// refresh_ahead from --refresh-ahead, batch_size from --batch-size (and statement_timeout from that batch) and
// top_n from --top-n when it is set; otherwise (the keepwarm-defaults row) refresh_ahead, batch_size, top_n and
// min_score are left to the shipped defaults. top_n is never derived from --hot.
func daemonTOML(c peersConfig, tuned bool, ks, key, url, dsn, query, notifications string) string {
	tuning, batch := "", warmer.DefaultBatchSize
	if tuned {
		batch = c.batchSize
		tuning = fmt.Sprintf("refresh_ahead = %q\nbatch_size = %d\n", c.refreshAhead.String(), batch)
		if c.topN > 0 {
			tuning += fmt.Sprintf("top_n = %d\n", c.topN)
		}
	}
	return fmt.Sprintf(`[redis]
url = %q
notifications = %q

[postgres]
dsn = %q
max_conns = %d
statement_timeout = %q
pool_wait_timeout = %q

[[keyspace]]
name = %q
key = %q
stale = "stale:${key}"
stale_ttl = "10m"
ttl = %q
jitter = %g
lock_ttl = %q
%squery = """
%s
"""
`, url, notifications, dsn, c.pgConns, daemonStatementTimeout(c.cost, batch).String(), daemonPoolWait.String(), ks, key,
		c.ttl.String(), c.jitter, c.lockTTL.String(), tuning, query)
}

// daemon writes the cell's config file, loads it as `keepwarm run` does (config.LoadEnv, without the
// environment, so that KEEPWARM_* variables cannot point it elsewhere), and builds the warmer from it with
// internal/assemble, on its own Redis client and PostgreSQL pool; its source goes through the counting wrapper.
func (r *peerRun) daemon(ctx context.Context, s *peerSetup, tuned bool, ksName, key string) (*warmer.Warmer, error) {
	notify := config.NotificationsOn
	if r.private {
		notify = config.NotificationsAuto
	}
	dir, err := os.MkdirTemp("", "kwbench-peers-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "keepwarm.toml")
	toml := daemonTOML(r.c, tuned, ksName, key, r.url, r.c.postgresURL, r.originQuery(r.name, true), notify)
	if err := os.WriteFile(path, []byte(toml), 0o600); err != nil {
		return nil, err
	}
	cfg, err := config.LoadEnv(path, nil)
	if err != nil {
		return nil, fmt.Errorf("the daemon's config: %w", err)
	}
	rdb, err := assemble.Redis(ctx, cfg, 5*time.Second)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, func() { _ = rdb.Close() })
	pool, err := assemble.Postgres(ctx, cfg, 5*time.Second)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, pool.Close)
	srcs, err := assemble.Sources(pool, cfg)
	if err != nil {
		return nil, err
	}
	ks := cfg.Keyspace(ksName)
	if ks == nil {
		return nil, fmt.Errorf("the daemon's config has no keyspace %q", ksName)
	}
	src := countedSource{o: r.origin, src: srcs[ksName], daemon: true}
	return warmer.New(rdb, warmer.Config{Logger: r.log, Keyspaces: []warmer.KeyspaceConfig{assemble.Keyspace(cfg, ks, src)},
		Notifications:   cfg.Redis.Notifications != config.NotificationsOff,
		AutoNotifyFlags: cfg.Redis.Notifications == config.NotificationsAuto, DB: cfg.Redis.DB})
}
