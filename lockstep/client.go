package lockstep

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"
)

// Loader reads the value of id from the origin (the database), as the bytes to cache. It returns an error
// wrapping ErrNotFound when the origin has no such record. Its context carries the values of the Get that
// started the rebuild but not its cancellation (other callers may be waiting on the same rebuild); it ends when
// the rebuild lock would expire.
type Loader func(ctx context.Context, id string) ([]byte, error)

// Client is the app-side read-through cache of one keyspace: Get serves values from Redis and, on a miss, lets
// exactly one process (the holder of the rebuild lock) call the Loader while the others wait, so a cache miss never
// becomes a stampede on the origin. It interoperates with keepwarm's daemon and with apps in other languages that
// follow docs/protocol.md. Make it with New; it is safe for concurrent use. Call Close when done.
type Client struct {
	rdb       RedisClient
	keyspace  string
	keys      *Keys
	load      Loader
	ttl       time.Duration
	cfg       config
	rec       Recorder
	log       *slog.Logger
	accessKey string
	ctxAware  bool // rdb ends a blocked read at the context's deadline (see honoursDeadlines)

	rebuildEst atomic.Int64 // decayed maximum of the loader's durations, ns: XFetch's δ without meta (observeRebuild)

	flights    singleflight.Group
	refreshing sync.Map // cache key → struct{}: background refreshes in flight

	closedFlag atomic.Bool
	mu         sync.Mutex // guards closed and wg.Add
	closed     bool
	wg         sync.WaitGroup
	stop       chan struct{} // closed by Close: stops the access flusher

	access *accessBuf // nil without WithAccessRecording

	near        *nearStore   // nil without WithNearCache
	nearTracker *nearTracker // its invalidation connection
	nearRec     NearRecorder // the Recorder, when it implements NearRecorder
}

// New makes the Client of keyspace (a name such as "product", used for metrics labels and the access set
// AccessKey(keyspace)). rdb may be a single-node, Sentinel or Cluster client (in Cluster mode call
// keys.CheckCluster first). keys is the keyspace's layout from NewKeys; load reads a value from the origin; ttl
// (> 0) is the cache TTL before jitter. Every argument and option is checked: errors wrap ErrInvalidArgument and
// name the argument. With WithAccessRecording, New starts a flusher goroutine that Close stops; with WithNearCache,
// the goroutine of the near cache's invalidation connection (refusals wrap ErrNearUnsupported).
func New(rdb RedisClient, keyspace string, keys *Keys, load Loader, ttl time.Duration, opts ...Option) (*Client, error) {
	var errs []error
	if rdb == nil {
		errs = append(errs, argError("rdb", "nil"))
	}
	if keyspace == "" {
		errs = append(errs, argError("keyspace", "empty"))
	}
	if keys == nil {
		errs = append(errs, argError("keys", "nil"))
	} else if keys.Cache.IsZero() || keys.Lock.IsZero() || keys.Meta.IsZero() {
		errs = append(errs, argError("keys", "not made by NewKeys"))
	}
	if load == nil {
		errs = append(errs, argError("load", "nil"))
	}
	if ttl <= 0 {
		errs = append(errs, argError("ttl", "%v is not > 0", ttl))
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			errs = append(errs, argError("option", "nil"))
			continue
		}
		if err := o(&cfg); err != nil {
			errs = append(errs, err)
		}
	}
	if cfg.staleTTL > 0 && keys != nil && keys.Stale.IsZero() {
		errs = append(errs, argError("stale ttl", "the keys have no stale template"))
	}
	var nearRdb *redis.Client
	if cfg.near != nil && rdb != nil {
		var err error
		if nearRdb, err = checkNear(rdb, &cfg); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	c := &Client{
		rdb:       rdb,
		keyspace:  keyspace,
		keys:      keys,
		load:      load,
		ttl:       ttl,
		cfg:       cfg,
		rec:       cfg.recorder,
		log:       cfg.logger.With("keyspace", keyspace),
		accessKey: AccessKey(keyspace),
		ctxAware:  honoursDeadlines(rdb),
		stop:      make(chan struct{}),
	}
	if cfg.sampleRate > 0 {
		c.access = &accessBuf{counts: map[string]float64{}, kick: make(chan struct{}, 1)}
		c.wg.Add(1)
		go c.flushLoop()
	}
	if nearRdb != nil {
		c.startNear(nearRdb)
	}
	return c, nil
}

// Keyspace returns the keyspace name given to New.
func (c *Client) Keyspace() string { return c.keyspace }

// enter registers a goroutine with Close's WaitGroup; false once the Client is closed.
func (c *Client) enter() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.wg.Add(1)
	return true
}

type filled struct {
	val   []byte
	stale bool
}

// Get returns the value of id: from the near cache when it holds it (WithNearCache, no round trip); from the cache
// key when present (one round trip); else, coalesced with the
// process's concurrent Gets of the same id, it takes the rebuild lock and re-reads the cache in one pipelined
// round trip. The lock holder (leader) calls the Loader and publishes the value with a jittered TTL (and the stale
// copy with WithStale) in a second round trip, releasing the lock; a concurrent publish found in the re-read is
// returned instead. Others (followers) poll the cache key with Backoff and, when the wait ends, serve the stale
// copy if there is one. A follower never calls the Loader.
//
// Every Redis round trip is bounded by the Redis timeout (WithRedisTimeout, default DefaultRedisTimeout = 1s),
// even when ctx has no deadline. When a read of the cache key fails (a timeout or a transport error: a stalled
// connection, a reset) and the keys have a stale template, Get makes one more bounded round trip that reads the
// cache key and the stale copy, and serves the stale copy when the value is still missing. So when Redis stops
// answering, a hit path Get fails within about 2 × the Redis timeout, and a miss within a few more of them plus the
// follower wait; a lock whose SET NX timed out is released in the background once Redis answers (a frozen Redis
// runs queued commands when it wakes), so it does not block rebuilds for the lock TTL.
//
// Errors: ErrInvalidID for a bad id; the Loader's error, wrapped (errors.Is(err, ErrNotFound) holds for a
// missing record, and nothing is cached then); ErrRebuildTimeout when a follower found nothing to serve;
// ctx.Err() when ctx ends first; ErrClosed after Close; or a Redis error, wrapping ErrRedisTimeout (and
// context.DeadlineExceeded) when Redis did not answer in time (Get does not fall back to the Loader when Redis
// fails, so an outage of Redis is not passed on to the origin). If the publish fails (lock lost, Redis error) the
// loaded value is still returned. The returned slice belongs to the caller.
func (c *Client) Get(ctx context.Context, id string) ([]byte, error) {
	var ks KeySet // all keys; on the plain hit path only the cache key is built
	var err error
	if c.cfg.xfetchBeta > 0 {
		ks, err = c.keys.For(id)
	} else {
		ks.Cache, err = c.keys.CacheKey(id)
	}
	if err != nil {
		return nil, err
	}
	if c.closedFlag.Load() {
		return nil, ErrClosed
	}
	c.recordAccess(id)
	var v []byte
	switch {
	case c.cfg.xfetchBeta > 0:
		v, err = c.readXFetch(ctx, ks)
	case c.near != nil:
		v, err = c.nearGet(ctx, ks.Cache)
	default:
		key := ks.Cache // the closure may outlive this call (see call): it must not read ks, which changes below
		err = c.call(ctx, func(ctx context.Context) error {
			b, err := c.rdb.Get(ctx, key).Bytes()
			v = b
			return err
		})
	}
	switch {
	case err == nil:
		c.rec.Hit(c.keyspace)
		return v, nil
	case !errors.Is(err, redis.Nil):
		err = fmt.Errorf("lockstep: get %q: %w", ks.Cache, err)
		if ctx.Err() != nil || replyError(err) || c.keys.Stale.IsZero() {
			return nil, err
		}
		if ks.Stale == "" {
			full, kerr := c.keys.For(id)
			if kerr != nil {
				return nil, kerr
			}
			ks = full
		}
		f, ferr := c.staleFallback(ctx, ks, err)
		if ferr != nil {
			return nil, ferr
		}
		if f.stale {
			c.rec.StaleServe(c.keyspace)
		} else {
			c.rec.Hit(c.keyspace)
		}
		return f.val, nil
	}
	c.rec.Miss(c.keyspace)
	if ks.Lock == "" {
		if ks, err = c.keys.For(id); err != nil {
			return nil, err
		}
	}
	ch := c.flights.DoChan(ks.Cache, func() (any, error) {
		if !c.enter() {
			return filled{}, ErrClosed
		}
		defer c.wg.Done()
		return c.fill(context.WithoutCancel(ctx), ks)
	})
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case res := <-ch:
		f, _ := res.Val.(filled)
		if res.Err != nil {
			return nil, res.Err
		}
		if f.stale {
			c.rec.StaleServe(c.keyspace)
		}
		if res.Shared {
			return bytes.Clone(f.val), nil
		}
		return f.val, nil
	}
}

// readXFetch reads the value, its remaining TTL and its δ in one pipelined round trip, and starts a background
// refresh when XFetch says so. A missing value returns redis.Nil.
func (c *Client) readXFetch(ctx context.Context, ks KeySet) ([]byte, error) {
	meta := ""
	if c.cfg.meta {
		meta = ks.Meta
	}
	v, pttl, delta, err := c.readWithPTTL(ctx, ks.Cache, meta)
	if err != nil {
		return nil, err
	}
	remaining := pttl.Val()
	d := time.Duration(c.rebuildEst.Load()) // the Client's own measurement
	if delta != nil {
		if ms, err := strconv.ParseInt(delta.Val(), 10, 64); err == nil && ms > 0 {
			d = time.Duration(ms) * time.Millisecond // the writer's, from the meta hash
		}
	}
	if pttl.Err() != nil || remaining <= 0 || d <= 0 {
		return v, nil // no TTL, or no δ (no meta, and this Client has not rebuilt yet): nothing to decide on
	}
	now := time.Now()
	if XFetch(now, now.Add(remaining), d, c.cfg.xfetchBeta, 1-c.cfg.rand()) {
		c.rec.EarlyRefresh(c.keyspace)
		c.refreshAsync(ctx, ks)
	}
	return v, nil
}

// readWithPTTL reads key's value and its remaining TTL in one pipelined round trip, and with a metaKey its meta
// hash's δ field too (delta is nil without). A missing value returns redis.Nil; pttl and delta carry their own
// errors.
func (c *Client) readWithPTTL(ctx context.Context, key, metaKey string) ([]byte, *redis.DurationCmd, *redis.StringCmd, error) {
	var get *redis.StringCmd
	var pttl *redis.DurationCmd
	var delta *redis.StringCmd
	if err := c.call(ctx, func(ctx context.Context) error {
		_, _ = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			get = p.Get(ctx, key)
			pttl = p.PTTL(ctx, key)
			if metaKey != "" {
				delta = p.HGet(ctx, metaKey, MetaDeltaField)
			}
			return nil
		})
		return get.Err()
	}); err != nil {
		return nil, nil, nil, err // the pipeline may still run (see call): its commands are not ours to read
	}
	v, err := get.Bytes()
	if err != nil {
		return nil, nil, nil, err
	}
	return v, pttl, delta, nil
}

// fill runs once per process per missing key (singleflight): lock + re-read, then rebuild or wait.
func (c *Client) fill(ctx context.Context, ks KeySet) (filled, error) {
	token := NewToken()
	var getCmd *redis.StringCmd
	var lead bool
	if err := c.call(ctx, func(ctx context.Context) error {
		op := newAcquireOp(ctx, c.rdb, ks.Lock, token, c.cfg.lockTTL)
		_, _ = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			_ = p.Process(ctx, op.cmd)
			getCmd = p.Get(ctx, ks.Cache)
			return nil
		})
		held, replies, err := finishAcquires(ctx, c.rdb, []*acquireOp{op})
		if err != nil {
			return err
		}
		lead = held[0]
		return replies[0]
	}); err != nil {
		err = fmt.Errorf("lockstep: acquire %q: %w", ks.Lock, err)
		if replyError(err) {
			return filled{}, err
		}
		c.releaseLater(ks, token) // the SET NX may have run, or may run when Redis wakes
		return c.staleFallback(ctx, ks, err)
	}
	v, err := getCmd.Bytes()
	if err == nil || !errors.Is(err, redis.Nil) {
		if lead {
			c.release(ctx, ks, token)
		}
		if err != nil {
			return filled{}, fmt.Errorf("lockstep: get %q: %w", ks.Cache, err)
		}
		return filled{val: v}, nil // published by another leader between our GET and our SET NX
	}
	if !lead {
		c.rec.LockContention(c.keyspace)
		c.log.Debug("lockstep: rebuild lock held elsewhere; waiting", "id", ks.ID)
		return c.wait(ctx, ks)
	}
	v, err = c.rebuild(ctx, ks, token, false)
	return filled{val: v}, err
}

// rebuild calls the Loader under the lock held with token and publishes the result. In refresh mode (an XFetch
// background refresh) a record gone from the origin is deleted from the cache; on a miss the lock is just
// released. It returns the loaded value even when the publish failed.
func (c *Client) rebuild(ctx context.Context, ks KeySet, token string, refresh bool) ([]byte, error) {
	start := c.cfg.clock()
	lctx, cancel := context.WithTimeout(ctx, c.cfg.lockTTL)
	v, err := c.load(lctx, ks.ID)
	cancel()
	delta := c.cfg.clock().Sub(start)
	if err == nil {
		c.observeRebuild(delta)
	}
	if err != nil {
		err = fmt.Errorf("lockstep: load %s %q: %w", c.keyspace, ks.ID, err)
		result := ResultError
		if errors.Is(err, ErrNotFound) {
			result = ResultMissing
			if refresh {
				perr := c.call(ctx, func(ctx context.Context) error {
					return Publish(ctx, c.rdb, Write{Keys: ks, Token: token, Delete: true, NoMeta: !c.cfg.meta})
				})
				if perr != nil && !errors.Is(perr, ErrLockLost) {
					c.log.Warn("lockstep: delete a record gone from the origin", "id", ks.ID, "error", perr)
					c.release(ctx, ks, token)
				}
			} else {
				c.release(ctx, ks, token)
			}
			c.log.Debug("lockstep: record not found", "id", ks.ID)
		} else {
			c.release(ctx, ks, token)
			if refresh {
				c.log.Warn("lockstep: background refresh failed", "id", ks.ID, "error", err)
			}
		}
		c.rec.Rebuild(c.keyspace, c.cfg.clock().Sub(start), result)
		return nil, err
	}
	w := Write{
		Keys:     ks,
		Token:    token,
		Value:    v,
		TTL:      Jitter(c.ttl, c.cfg.jitter, c.cfg.rand()),
		StaleTTL: c.cfg.staleTTL,
		Rebuild:  delta,
		NoMeta:   !c.cfg.meta,
	}
	err = c.call(ctx, func(ctx context.Context) error { return Publish(ctx, c.rdb, w) })
	switch {
	case err == nil:
		c.rec.Rebuild(c.keyspace, c.cfg.clock().Sub(start), ResultOK)
	case errors.Is(err, ErrLockLost):
		c.rec.Rebuild(c.keyspace, c.cfg.clock().Sub(start), ResultLockLost)
		c.log.Debug("lockstep: lock expired before publish; value not cached", "id", ks.ID, "rebuild", delta)
	default:
		c.rec.Rebuild(c.keyspace, c.cfg.clock().Sub(start), ResultError)
		c.log.Warn("lockstep: publish failed; value not cached", "id", ks.ID, "error", err)
		c.release(ctx, ks, token)
	}
	return v, nil
}

// observeRebuild folds one loader duration into the Client's δ estimate: it rises at once to a slower rebuild
// and decays by 1/16 of the gap on a faster one (a cheap upper-quantile tracker; XFetch wants δ on the safe, early
// side).
func (c *Client) observeRebuild(d time.Duration) {
	for {
		old := c.rebuildEst.Load()
		next := int64(d)
		if int64(d) < old {
			next = old - (old-int64(d))/16
		}
		if c.rebuildEst.CompareAndSwap(old, next) {
			return
		}
	}
}

// release releases the lock of ks held with token. When the reply is lost (a timeout, a transport error) it
// leaves the job to releaseLater; after an error reply the lock expires by itself.
func (c *Client) release(ctx context.Context, ks KeySet, token string) {
	err := c.call(ctx, func(ctx context.Context) error {
		_, err := Release(ctx, c.rdb, ks.Lock, token)
		return err
	})
	switch {
	case err == nil:
	case replyError(err):
		c.log.Warn("lockstep: release lock failed; it expires by itself", "id", ks.ID, "error", err)
	default:
		c.log.Debug("lockstep: release lock failed; retrying in the background", "id", ks.ID, "error", err)
		c.releaseLater(ks, token)
	}
}

// staleFallback is Get's answer when a round trip failed with cause (a timeout or a transport error, not an error
// reply): one more bounded round trip reads the cache key and, when the keys have a stale template, the stale
// copy. go-redis drops a connection that timed out, so this read goes over another one. It returns the value, else
// the stale copy (marked stale; the caller records the serve), else cause.
func (c *Client) staleFallback(ctx context.Context, ks KeySet, cause error) (filled, error) {
	if ks.Stale == "" {
		return filled{}, cause
	}
	var get, stale *redis.StringCmd
	err := c.call(ctx, func(ctx context.Context) error {
		_, _ = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			get = p.Get(ctx, ks.Cache)
			stale = p.Get(ctx, ks.Stale)
			return nil
		})
		if err := get.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		return nil
	})
	if err != nil {
		return filled{}, cause
	}
	if v, err := get.Bytes(); err == nil {
		return filled{val: v}, nil
	}
	v, err := stale.Bytes()
	if err != nil {
		return filled{}, cause
	}
	c.log.Debug("lockstep: redis read failed; serving the stale copy", "id", ks.ID, "error", cause)
	return filled{val: v, stale: true}, nil
}

// wait polls the cache key with the Backoff while another process rebuilds. The last poll also reads the stale
// copy in the same round trip.
func (c *Client) wait(ctx context.Context, ks KeySet) (filled, error) {
	b := c.cfg.backoff
	start := c.cfg.clock()
	deadline := start.Add(b.Total)
	sleep := b.Initial
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	done := func(result string) { c.rec.Wait(c.keyspace, c.cfg.clock().Sub(start), result) }
	for {
		remaining := time.Until(deadline)
		last := sleep >= remaining
		if last {
			sleep = max(remaining, 0)
		}
		timer.Reset(sleep)
		select {
		case <-ctx.Done():
			done(WaitCanceled)
			return filled{}, ctx.Err()
		case <-c.stop:
			done(WaitCanceled)
			return filled{}, ErrClosed
		case <-timer.C:
		}
		var get, stale *redis.StringCmd
		err := c.call(ctx, func(ctx context.Context) error {
			if last && ks.Stale != "" {
				_, _ = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
					get = p.Get(ctx, ks.Cache)
					stale = p.Get(ctx, ks.Stale)
					return nil
				})
			} else {
				get = c.rdb.Get(ctx, ks.Cache)
			}
			return get.Err()
		})
		var v []byte
		if err == nil {
			v, err = get.Bytes()
		}
		switch {
		case err == nil:
			done(WaitHit)
			return filled{val: v}, nil
		case !errors.Is(err, redis.Nil):
			done(WaitError)
			err = fmt.Errorf("lockstep: wait for %q: %w", ks.Cache, err)
			if replyError(err) || ctx.Err() != nil {
				return filled{}, err
			}
			return c.staleFallback(ctx, ks, err)
		}
		if !last {
			sleep = min(time.Duration(float64(sleep)*b.Multiplier), b.Max)
			continue
		}
		if stale != nil {
			v, err := stale.Bytes()
			switch {
			case err == nil:
				done(WaitStale)
				return filled{val: v, stale: true}, nil
			case !errors.Is(err, redis.Nil):
				done(WaitError)
				return filled{}, fmt.Errorf("lockstep: get stale %q: %w", ks.Stale, err)
			}
		}
		done(WaitTimeout)
		return filled{}, fmt.Errorf("%w: %s %q after %v", ErrRebuildTimeout, c.keyspace, ks.ID, b.Total)
	}
}

// refreshAsync starts an XFetch background refresh of ks unless one is already running in this process.
func (c *Client) refreshAsync(ctx context.Context, ks KeySet) {
	if _, busy := c.refreshing.LoadOrStore(ks.Cache, struct{}{}); busy {
		return
	}
	if !c.enter() {
		c.refreshing.Delete(ks.Cache)
		return
	}
	ctx = context.WithoutCancel(ctx)
	go func() {
		defer c.wg.Done()
		defer c.refreshing.Delete(ks.Cache)
		token := NewToken()
		var ok bool
		err := c.call(ctx, func(ctx context.Context) (err error) {
			ok, err = Acquire(ctx, c.rdb, ks.Lock, token, c.cfg.lockTTL)
			return err
		})
		switch {
		case err != nil:
			c.log.Warn("lockstep: background refresh: acquire lock", "id", ks.ID, "error", err)
			if !replyError(err) {
				c.releaseLater(ks, token) // the SET NX may have run, or may run when Redis wakes
			}
			return
		case !ok:
			c.rec.LockContention(c.keyspace)
			c.log.Debug("lockstep: background refresh skipped: lock held elsewhere", "id", ks.ID)
			return
		}
		_, _ = c.rebuild(ctx, ks, token, true)
	}()
}

// Invalidate is the write path's delete (see the package function Invalidate): it deletes the cache key, meta
// hash and lock of id in one DEL, so the next Get rebuilds it and a rebuild in flight (by this process, another
// app or keepwarm's daemon) cannot publish the value it read before the change. Call it after the origin's
// transaction commits. The stale copy stays (still served to followers that time out). With WithNearCache the
// id is also dropped from this Client's near cache before Invalidate returns (other processes drop it when Redis's
// invalidation reaches them). The call is bounded like
// every Redis call of the Client (WithRedisTimeout). Errors: ErrInvalidID, ErrClosed, ErrRedisTimeout, or the
// Redis error.
func (c *Client) Invalidate(ctx context.Context, id string) error {
	ks, err := c.keys.For(id)
	if err != nil {
		return err
	}
	if c.closedFlag.Load() {
		return ErrClosed
	}
	err = c.call(ctx, func(ctx context.Context) error { return Invalidate(ctx, c.rdb, ks) })
	if c.near != nil {
		// Now, not when Redis's invalidation comes back: this process reads its own write at once, and a fill
		// that read the old value before the DEL is refused. Also after a failed DEL, which may have run.
		c.near.invalidate(ks.Cache)
	}
	return err
}

// Close stops the Client: later Gets return ErrClosed, followers still waiting get ErrClosed, and Close waits
// until the goroutines it started (rebuilds whose callers left, XFetch refreshes, the access flusher) have
// finished, then flushes the buffered access counts.
// It returns ctx.Err() (wrapped) if ctx ends first; calling it again waits again. It does not close rdb, which
// belongs to the caller.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		c.closedFlag.Store(true)
		close(c.stop)
	}
	c.mu.Unlock()
	done := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("lockstep: close %s: %w", c.keyspace, ctx.Err())
	}
	if c.access != nil {
		if err := c.flushAccess(ctx); err != nil {
			return fmt.Errorf("lockstep: close %s: %w", c.keyspace, err)
		}
	}
	return nil
}
