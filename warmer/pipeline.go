package warmer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/backoff"
	"github.com/keepwarm/keepwarm/lockstep"
)

// Bounds of the lock release that ends every batch. A release is token-checked, so it is always safe to repeat:
// after a failure it is retried with back-off (backoff.Delay from releaseRetryBase up to releaseRetryMax) until
// Redis answers, for at most releaseRetryFor, or for releaseTimeout once ctx has ended (shutdown, an interrupted
// warmup). Each attempt is bounded by releaseTimeout.
const (
	// pausedSlack: an origin query whose client-side deadline fired this much later than due was not slow; the
	// daemon itself was paused.
	pausedSlack = time.Second

	releaseTimeout   = 2 * time.Second
	releaseRetryBase = 100 * time.Millisecond
	releaseRetryMax  = 2 * time.Second
	releaseRetryFor  = 2 * time.Minute
)

// item is one key in a batch of the refresh pipeline. The pipeline sets result (one of the ResultX values) and,
// for ResultError, reason (one of the ReasonX values); for written values ttl, size and prevTTL.
type item struct {
	id    string
	ks    lockstep.KeySet
	hot   batchKey      // the daemon's hot key (its loop finds the state with hotOf); zero in a warmup or a change
	pttl  time.Duration // TTL left when checked under the lock (daemon only)
	owned bool          // this batch holds (or may hold) the key's lock: released at the end
	lost  bool          // a lease renewal found the lock gone or taken (set by the batch)

	// The lease renewal's view of the key (pipeline.mu guards them; the renewal goroutine touches nothing else).
	renew     bool // the batch acquired this lock: renew it until the release
	closing   bool // a publish or the fail-safe of this key is under way: the lock may vanish by our own doing
	leaseLost bool // a renewal found the lock gone or taken; folded into lost by the batch (foldLeasesLocked)
	// goneInLease: a renewal answered before the lease's deadline found the lock gone: it vanished while the
	// lease held (an invalidation, or the batch's own publish), whenever the publish's own reply comes.
	goneInLease bool

	result      string
	reason      string // for ResultError: which failure (ReasonX)
	err         error
	ttl         time.Duration // the TTL written
	prevTTL     time.Duration // the cache key's TTL just before the publish (lockstep.PrevGone: it had expired)
	prevUnknown bool          // a re-sent publish wrote the value: prevTTL is not known
	missing     bool          // the origin had no row: the missing policy applied
	rescheduled bool          // the daemon's fail-safe already rescheduled this key
	delete      bool          // the missing policy deleted the key
}

// fail settles it as an error with reason and cause.
func (it *item) fail(reason string, err error) {
	it.result, it.reason, it.err = ResultError, reason, err
}

// pipeline is one batch's run through the refresh pipeline, shared by the daemon's refresh-ahead and by
// warmups (keepwarm warmup and [[schedule]] runs):
//
//  1. wait for the keyspace's origin budget (token bucket);
//  2. acquire the locks, pipelined (one round trip); keys locked elsewhere are skipped as ResultLocked, keys
//     whose SET NX got an error reply (OOM, TRYAGAIN) fail with that reason, and those refused for memory go to
//     failSafeUnlocked when it is set;
//  3. optionally re-check the owned keys under their locks (the daemon's PTTL check);
//  4. run one origin query for the rest (the leases are renewed every lease/4 from step 2 until step 6: see
//     renewLeases);
//  5. publish values with the token-checked script, pipelined, with the TTL that ttl returns, and apply the
//     missing policy; each key's outcome is classified: written, lock lost (another token), lock gone (evicted
//     or invalidated while the lease was valid), or an error reply (nothing written, the lock still ours);
//  6. release every lock still held, even when ctx was cancelled; after a transport error, every lock the batch
//     may hold, retried until Redis answers (the release is token-checked, so this is always safe).
type pipeline struct {
	k     *keyspace // for its origin budget (limiter), logger and outage notes
	rdb   redis.UniversalClient
	m     *metrics
	now   func() time.Time
	cfg   KeyspaceConfig
	token string
	// ttl returns the TTL of one written value: jittered for refreshes, spread for warmups. It must be safe
	// for concurrent use.
	ttl func() time.Duration
	// recheck, when set, sees the owned items under their locks and returns those that still need the origin;
	// it settles the others itself.
	recheck func(ctx context.Context, items []*item) ([]*item, error)
	// failSafe, when set, keeps the current values of items alive that cannot be refreshed now (the origin
	// failed, or the new value is too large), and reschedules them; without it they fail.
	failSafe func(ctx context.Context, items []*item)
	// failSafeUnlocked, when set, keeps the current values of items whose lock Redis refused for memory (OOM)
	// alive without a lock, and reschedules them; without it they fail.
	failSafeUnlocked func(ctx context.Context, items []*item)
	// skipOrigin, when set, runs the batch without an origin query: the owned keys go straight to failSafe with
	// this error (ReasonOriginFailing), and the origin budget (limiter) is not waited for. The daemon uses it for
	// due keys while the origin fails and a probe batch is in flight (see loopState.dispatch).
	skipOrigin error
	// extra limits the batch further than the keyspace's budget (a warmup's --rate); may be nil.
	extra interface {
		WaitN(ctx context.Context, n int) error
	}

	rebuild time.Duration // duration of the origin query, once run
	start   time.Time     // when publishing began: a written key expires no earlier than start + ttl

	lease time.Duration // TTL of the batch's locks (KeyspaceConfig.lease), renewed every lease/4

	// mu guards what the lease renewal (renewLeases) shares with the batch: leaseUntil, and the items' renew,
	// closing and leaseLost fields (and owned, lost and result where the batch sets them).
	mu         sync.Mutex
	leaseUntil time.Time // the batch's locks cannot have expired before this
	lateNoted  bool      // the renewals' current lateness is counted and logged (noteLateLeasesLocked)

	renewals *leaseRenewal // the running lease renewal; nil before the locks are acquired
}

// newPipeline returns a pipeline for one batch of k under cfg, writing values with the TTLs that ttl returns.
func (k *keyspace) newPipeline(cfg KeyspaceConfig, ttl func() time.Duration) *pipeline {
	return &pipeline{k: k, rdb: k.w.rdb, m: k.w.m, now: k.w.now, cfg: cfg, ttl: ttl}
}

// run sends items through the pipeline. It returns an error, with the unsettled items, only when the batch as a
// whole could not run (ctx ended while waiting for budget, or Redis failed before or at publishing): the caller
// retries or counts those items as failed.
func (p *pipeline) run(ctx context.Context, items []*item) error {
	p.token = LockToken(p.k.w.cfg.Fleet.ReplicaID)
	p.lease = p.cfg.Lease()
	defer func() {
		p.renewals.stop() // no renewal starts after this; then the locks are released
		p.releaseOwned(ctx, items)
		p.renewals.wait() // a renewal still in flight (Redis slow) ends before the batch does
	}()
	if p.extra != nil {
		if err := p.extra.WaitN(ctx, len(items)); err != nil {
			return err
		}
	}
	if p.skipOrigin == nil {
		if err := p.k.limiter.Wait(ctx); err != nil {
			return err
		}
	}
	owned, err := p.acquire(ctx, items)
	if err != nil {
		return err
	}
	p.renewals = p.renewLeases(ctx, owned)
	if oom := p.refusedForMemory(items); len(oom) > 0 {
		p.failSafeUnlocked(ctx, oom)
	}
	if p.recheck != nil && len(owned) > 0 {
		if owned, err = p.recheck(ctx, owned); err != nil {
			return err
		}
	}
	if len(owned) == 0 {
		return nil
	}
	if p.skipOrigin != nil && p.failSafe != nil {
		for _, it := range owned {
			it.fail(ReasonOriginFailing, p.skipOrigin)
		}
		p.failSafe(ctx, owned)
		return nil
	}
	return p.fetchAndPublish(ctx, owned)
}

// acquire takes the items' locks in one pipelined round trip and returns the items it owns. After a transport
// error every item counts as owned, so that releaseOwned releases the locks that the pipeline's SET NX commands
// may still take when Redis wakes up.
func (p *pipeline) acquire(ctx context.Context, items []*item) ([]*item, error) {
	locks := make([]string, len(items))
	for i, it := range items {
		locks[i] = it.ks.Lock
	}
	sent := p.now()
	ok, err := lockstep.AcquireMany(ctx, p.rdb, locks, p.token, p.lease)
	var replies lockstep.ReplyErrors
	if err != nil && !errors.As(err, &replies) {
		p.mu.Lock()
		for _, it := range items {
			it.owned = true // maybe: the commands may run late
		}
		p.mu.Unlock()
		return nil, err
	}
	var owned []*item
	p.mu.Lock()
	p.leaseUntil = sent.Add(p.lease)
	for i, it := range items {
		switch {
		case replies[i] != nil:
			it.fail(redisReason(replies[i]), fmt.Errorf("acquire lock %q: %w", it.ks.Lock, replies[i]))
		case ok[i]:
			it.owned, it.renew = true, true
			owned = append(owned, it)
		default:
			it.result = ResultLocked
		}
	}
	p.mu.Unlock()
	var refused, oom []*item
	for _, it := range items {
		switch {
		case it.result != ResultError:
		case it.reason == ReasonOOM && p.failSafeUnlocked != nil:
			oom = append(oom, it) // logged once per episode by the fail-safe (oomExtending)
		default:
			refused = append(refused, it)
		}
	}
	p.k.warnRefused("lock refused by Redis; retrying with back-off", refused)
	if len(oom) > 0 {
		p.k.log.Debug("lock refused by Redis for memory; extending the values without a lock", "keys", len(oom),
			"first_key", oom[0].ks.Cache, "error", oom[0].err)
	}
	replied := make([]error, 0, len(replies))
	for _, e := range replies {
		replied = append(replied, e)
	}
	accepted := len(replies) < len(items)
	p.k.w.refusals.notePipeline("lock", firstRefusal(replied), accepted, p.now())
	if accepted {
		p.k.w.oomOver()
	}
	p.m.locks.WithLabelValues(p.cfg.Name, "acquired").Add(float64(len(owned)))
	p.m.locks.WithLabelValues(p.cfg.Name, "held").Add(float64(len(items) - len(owned) - len(replies)))
	return owned, nil
}

// refusedForMemory returns the items whose lock Redis refused for memory (ReasonOOM), for failSafeUnlocked; none
// when the pipeline has no failSafeUnlocked (warmups).
func (p *pipeline) refusedForMemory(items []*item) []*item {
	if p.failSafeUnlocked == nil {
		return nil
	}
	var oom []*item
	for _, it := range items {
		if it.result == ResultError && it.reason == ReasonOOM {
			oom = append(oom, it)
		}
	}
	return oom
}

// fetchAndPublish runs one origin query for items and publishes the results.
func (p *pipeline) fetchAndPublish(ctx context.Context, items []*item) error {
	cfg := p.cfg
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.id
	}
	fstart := p.now()
	values, bad, last, err := p.fetch(ctx, ids)
	p.rebuild = p.now().Sub(fstart) // the whole fetch, splits included: what the next rebuild may take
	if err != nil && ctx.Err() != nil {
		return ctx.Err() // shutdown or an interrupted warmup: not the origin's failure
	}
	if err != nil {
		reason := originReason(err)
		for _, it := range items {
			it.fail(reason, err)
		}
		if p.failSafe != nil {
			// A client-side deadline that fired well after it was due means this process was paused (SIGSTOP,
			// a stalled VM) while PostgreSQL had answered: not the origin's failure.
			paused := reason == ReasonOriginTimeout && last > cfg.queryBound()+pausedSlack
			p.k.originFailed(cfg, reason, paused, err)
			p.closeLeases(items)
			p.failSafe(ctx, items)
		}
		return nil
	}
	// The origin answered every query, even when some ids failed on their own: it is healthy.
	p.k.originOK()
	if len(bad) > 0 {
		var badIDs []string
		kept := items[:0:0]
		for _, it := range items {
			if e, ok := bad[it.id]; ok {
				it.fail(ReasonBadInput, e)
				badIDs = append(badIDs, it.id)
				continue
			}
			kept = append(kept, it)
		}
		items = kept
		// Not written and not kept alive by the fail-safe (the origin is fine; this id is not): the lock is
		// released at the end of the batch, and the key retried with back-off.
		p.k.skipInvalid(ctx, cfg, sourceOrigin, badIDs)
	}

	var writes []lockstep.Write
	var witems, large []*item
	p.mu.Lock()
	p.foldLeasesLocked(items)
	for _, it := range items {
		if it.lost {
			it.result = ResultLockLost
			continue
		}
		v, found := values[it.id]
		switch {
		case found && cfg.MaxValueBytes > 0 && len(v) > cfg.MaxValueBytes:
			it.result = ResultTooLarge
			it.err = fmt.Errorf("value of %d bytes exceeds max_value_bytes %d", len(v), cfg.MaxValueBytes)
			large = append(large, it)
		case found:
			it.ttl = p.ttl()
			writes = append(writes, lockstep.Write{Keys: it.ks, Token: p.token, Value: v, TTL: it.ttl,
				StaleTTL: cfg.StaleTTL, Rebuild: p.rebuild, NoMeta: !cfg.KeepMeta})
			witems = append(witems, it)
		default: // missing: the origin has no row (or a NULL value)
			it.missing = true
			switch cfg.Missing {
			case MissingDelete:
				it.delete = true
				writes = append(writes, lockstep.Write{Keys: it.ks, Token: p.token, Delete: true, NoMeta: !cfg.KeepMeta})
				witems = append(witems, it)
			case MissingTombstone:
				it.ttl = cfg.TombstoneTTL
				writes = append(writes, lockstep.Write{Keys: it.ks, Token: p.token, Value: cfg.Tombstone,
					TTL: cfg.TombstoneTTL, Rebuild: p.rebuild, NoMeta: !cfg.KeepMeta})
				witems = append(witems, it)
			default: // keep: leave the current value to its TTL; the lock is released at the end
				it.result = ResultMissing
			}
		}
	}
	for _, it := range witems {
		it.closing = true
	}
	for _, it := range large {
		it.closing = true
	}
	p.mu.Unlock()
	for _, it := range large {
		p.k.log.Warn("refusing value", "id", it.id, "key", it.ks.Cache, "error", it.err)
	}
	if len(large) > 0 && p.failSafe != nil {
		p.failSafe(ctx, large) // the old value stays under the fail-safe rules; the id backs off
	}
	if len(writes) == 0 {
		return nil
	}
	p.start = p.now()
	results, err := lockstep.PublishMany(ctx, p.rdb, writes)
	if err != nil {
		return err // the items stay owned: releaseOwned releases whatever the scripts left
	}
	// A lock found gone is an invalidation only if the script ran while the lease held: before the reply came
	// back, and the reply came back before leaseUntil. Judged by when the publish was sent instead, a publish
	// sent just before a Redis stall and run after it found the lock expired by the stall, and its key, gone by
	// the same stall, passed for invalidated: a miss not counted.
	replied := p.now()
	p.mu.Lock()
	var replies []*item
	for i, it := range witems {
		r := results[i]
		it.prevTTL = r.PrevTTL
		switch {
		case r.Err == nil:
			it.owned = false // the script deleted the lock
			it.result = ResultOK
			if it.missing {
				it.result = ResultMissing
			}
		case errors.Is(r.Err, lockstep.ErrLockGone) && (replied.Before(p.leaseUntil) || it.goneInLease):
			it.owned = false
			it.result, it.err = ResultLockGone, r.Err
		case errors.Is(r.Err, lockstep.ErrLockLost), errors.Is(r.Err, lockstep.ErrLockGone):
			// Taken by another token, or gone after the lease could have lapsed (renewals were late): nothing
			// was written, and the lock is not ours.
			it.owned = false
			it.result, it.err = ResultLockLost, r.Err
		default: // an error reply: nothing was written and the lock is still ours (publish.lua fails before writing)
			it.fail(redisReason(r.Err), fmt.Errorf("publish %q: %w", it.ks.Cache, r.Err))
			replies = append(replies, it)
		}
	}
	p.mu.Unlock()
	var replyErrs []error
	written := false
	for _, r := range results {
		written = written || r.Err == nil
		replyErrs = append(replyErrs, r.Err)
	}
	p.k.w.refusals.notePipeline("publish", firstRefusal(replyErrs), written, replied)
	p.checkOwnPublish(ctx, writes, witems)
	p.k.warnRefused("publish refused by Redis; lock released, retrying with back-off", replies)
	return nil
}

// fetch runs the origin query for ids (Source.Fetch, bounded by queryBound; the leases are renewed meanwhile).
// When a query fails on its input (the Source's BadInput error: a data error such as SQLSTATE class 22, or an id
// it refuses), fetch splits the ids in halves and fetches each again, down to single ids, so that an id that
// fails on its own comes back in bad, with its error, and every other id's value in values. One bad id among n
// costs about 2·log2(n) more queries; they run in the batch's origin slot, one at a time, without waiting for the
// origin budget again. Any other error fails the whole fetch (err), as an origin failure. last is the duration
// of the last query run (for the paused-process test). Each query is counted in
// keepwarm_warmer_origin_queries_total (ok, error or bad_input) and timed.
func (p *pipeline) fetch(ctx context.Context, ids []string) (values map[string][]byte, bad map[string]error, last time.Duration, err error) {
	cfg := p.cfg
	qctx, cancel := context.WithTimeout(ctx, cfg.queryBound())
	qstart := p.now()
	values, _, err = cfg.Src.Fetch(qctx, ids) // every id not in values is missing (the Source contract)
	last = p.now().Sub(qstart)
	cancel()
	p.m.originSeconds.WithLabelValues(cfg.Name).Observe(last.Seconds())
	switch {
	case err == nil:
		p.m.originQueries.WithLabelValues(cfg.Name, "ok").Inc()
		p.m.originRows.WithLabelValues(cfg.Name).Add(float64(len(values)))
		return values, nil, last, nil
	case ctx.Err() != nil || !isBadInput(err):
		p.m.originQueries.WithLabelValues(cfg.Name, "error").Inc()
		return nil, nil, last, err
	}
	p.m.originQueries.WithLabelValues(cfg.Name, ReasonBadInput).Inc()
	if len(ids) == 1 {
		return nil, map[string]error{ids[0]: err}, last, nil
	}
	values, bad = map[string][]byte{}, map[string]error{}
	for _, half := range [][]string{ids[:len(ids)/2], ids[len(ids)/2:]} {
		v, b, l, err := p.fetch(ctx, half)
		last = l
		if err != nil {
			return nil, nil, last, err
		}
		maps.Copy(values, v)
		maps.Copy(bad, b)
	}
	return values, bad, last, nil
}

// checkOwnPublish reads its GETs in pipelines of ownPublishChunk keys, each tried up to ownPublishAttempts times:
// small pipelines, so that one connection reset costs one chunk, not the whole check.
const (
	ownPublishChunk    = 8
	ownPublishAttempts = 3
)

// checkOwnPublish re-reads the cache keys of the items whose publish found the lock gone (lock_gone). go-redis
// re-sends a command whose reply was lost (a connection reset), and a re-sent publish finds the lock that its first
// copy already deleted: the value was written, by us. A key that holds exactly the value this batch wrote is
// therefore ResultOK (the TTL the old value had left is unknown: prevUnknown); any other is a real lock_gone (an
// invalidation). Pipelined GETs, only when some publish reported lock_gone; an item whose GET failed stays
// lock_gone.
func (p *pipeline) checkOwnPublish(ctx context.Context, writes []lockstep.Write, witems []*item) {
	var idx []int
	for i, it := range witems {
		if it.result == ResultLockGone && !writes[i].Delete {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return
	}
	gets := make([]*redis.StringCmd, len(idx))
	for start := 0; start < len(idx); start += ownPublishChunk {
		chunk := idx[start:min(start+ownPublishChunk, len(idx))]
		for attempt := 0; attempt < ownPublishAttempts; attempt++ { // a connection reset may take this reply too
			_, err := p.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
				for j, i := range chunk {
					gets[start+j] = pl.Get(ctx, witems[i].ks.Cache)
				}
				return nil
			})
			if err == nil || errors.Is(err, redis.Nil) || isErrorReply(err) || ctx.Err() != nil {
				break
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for j, i := range idx {
		if v, err := gets[j].Bytes(); err == nil && bytes.Equal(v, writes[i].Value) {
			it := witems[i]
			it.result, it.err, it.prevUnknown = ResultOK, nil, true
			if it.missing {
				it.result = ResultMissing
			}
		}
	}
}

// leaseRenewal is a running renewLeases: stop ends its loop, wait waits for a renewal still in flight.
type leaseRenewal struct {
	done     chan struct{}
	loop     sync.WaitGroup // the ticker loop
	inflight sync.WaitGroup // the renewal round trip under way, if any
}

func (r *leaseRenewal) stop() {
	if r != nil && r.done != nil {
		close(r.done)
		r.loop.Wait()
		r.done = nil
	}
}

func (r *leaseRenewal) wait() {
	if r != nil {
		r.inflight.Wait()
	}
}

// renewLeases renews the locks the batch acquired (items with renew set) every lease/4 with lockstep.ExtendMany,
// from the acquisition until the returned renewal is stopped (just before the release), or ctx ends. The daemon's
// leases are short (KeyspaceConfig.lease) so that the locks of a replica that dies lapse within a fraction of the
// lead; renewing them for as long as the batch holds them (re-check, query, publish, fail-safe) keeps a slow
// batch from losing them. At most one renewal is in flight; the ticker never waits for it, so that renewals late
// by 3/4 of a lease are counted at the first tick that can tell (noteLateLeasesLocked), however long Redis takes
// to answer; the keys are kept, since every write is token-checked. A renewal that finds a lock gone or taken
// marks the key lost (leaseLost), unless the batch's own publish or fail-safe is under way for it (closing). The
// batch folds leaseLost into lost (foldLeasesLocked) where it decides.
func (p *pipeline) renewLeases(ctx context.Context, items []*item) *leaseRenewal {
	r := &leaseRenewal{done: make(chan struct{})}
	type result struct {
		sent time.Time
		live []*item
		ok   []bool
		err  error
	}
	results := make(chan result, 1) // one renewal in flight at most, so its send never blocks
	r.loop.Add(1)
	go func() {
		defer r.loop.Done()
		t := time.NewTicker(p.lease / 4)
		defer t.Stop()
		busy := false
		for {
			select {
			case <-r.done:
				return
			case <-ctx.Done():
				return
			case res := <-results:
				busy = false
				p.renewed(items, res.sent, res.live, res.ok, res.err)
				continue
			case <-t.C:
			}
			p.mu.Lock()
			p.noteLateLeasesLocked(items)
			var live []*item
			for _, it := range items {
				if it.renew && !it.leaseLost {
					live = append(live, it)
				}
			}
			p.mu.Unlock()
			if busy || len(live) == 0 {
				continue
			}
			busy = true
			locks := make([]string, len(live))
			for i, it := range live {
				locks[i] = it.ks.Lock
			}
			r.inflight.Add(1)
			go func() {
				defer r.inflight.Done()
				rctx, cancel := context.WithTimeout(ctx, p.lease/2)
				defer cancel()
				sent := p.now()
				ok, err := lockstep.ExtendMany(rctx, p.rdb, locks, p.token, p.lease)
				results <- result{sent, live, ok, err}
			}()
		}
	}()
	return r
}

// renewed applies one renewal's result: a lock found gone or taken is lost (unless the batch's own publish or
// fail-safe may have deleted it), and one found gone by a renewal answered before the deadline vanished while the
// lease held (goneInLease: a publish that finds it gone later is an invalidation, not a lapse). The deadline
// moves to when the renewal was sent, plus the lease, when it kept at least one lock (the batch's locks share one
// lease: one still held when Redis ran the renewal proves the lease was), or when it was sent before the current
// deadline (a lock it found gone may have vanished while the lease held; judged so, an invalidation racing the
// renewals on a loaded machine is not taken for a lapse: TestInvalidationDuringRefreshIsNoMiss). One sent after
// the deadline that kept none proves nothing: Redis may have run it after the lease lapsed, and moving the
// deadline then made a publish that found its lock gone pass for an invalidation (settleOne's lock_gone), not a
// lapse. A Redis SIGSTOP soak (seed 7201) lost five misses so: renewals sent while Redis was stopped, the last
// just before it resumed, found every lock lapsed, and the publishes that came back after them were read as
// invalidated. A lock found gone is not renewed again, so renewals that keep nothing extend the deadline by one
// lease at most. A failed round trip changes nothing (noteLateLeasesLocked counts the lateness; the publish
// checks the token).
func (p *pipeline) renewed(items []*item, sent time.Time, live []*item, ok []bool, err error) {
	if err != nil {
		p.k.log.Debug("lease renewal failed", "locks", len(live), "error", err)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	inLease := p.now().Before(p.leaseUntil) // answered (at the latest now) while the lease held
	for i, it := range live {
		if !ok[i] && inLease {
			it.goneInLease = true
		}
	}
	if slices.Contains(ok, true) || sent.Before(p.leaseUntil) {
		p.leaseUntil = sent.Add(p.lease)
	}
	var kept, lost int
	for i, it := range live {
		switch {
		case ok[i]:
			kept++
		case it.closing:
			it.renew = false // our publish or fail-safe deleted it
		default:
			it.renew, it.leaseLost = false, true
			lost++
		}
	}
	p.m.leaseExtends.WithLabelValues(p.cfg.Name, "ok").Add(float64(kept))
	p.m.leaseExtends.WithLabelValues(p.cfg.Name, "lost").Add(float64(lost))
	p.noteLateLeasesLocked(items)
}

// noteLateLeasesLocked counts, once per stall, the renewed locks of items (not yet closing) for which no renewal
// sent in the last 3/4 of a lease has succeeded (now ≥ leaseUntil − lease/4): Redis may not have seen a renewal
// for that long, and the lease may lapse before the next renewal lands. The keys are not given up: every write the
// batch may still make (publish.lua, extend_value.lua) and every renewal (extend.lua) is token-checked, so a lock
// that did lapse is never written through, and one that did not (the stall was this process's, or the round
// trip's) still lets the batch publish the value it already read. Giving them up instead threw away good origin
// reads on every scheduling stall longer than 3/4 of a lease (375 ms at the demo's settings), and the keys,
// retried with back-off, expired: a soak's kill -9 run on a loaded machine saw 19 keys of one batch given up 0.6 s
// before they fell due, and 14 of them missed. Logged at debug: on a loaded host it comes at every stall, and the
// counter is what to watch (a lock that did lapse shows as result lock_lost). Called with p.mu held.
func (p *pipeline) noteLateLeasesLocked(items []*item) {
	if p.now().Before(p.leaseUntil.Add(-p.lease / 4)) {
		p.lateNoted = false
		return
	}
	if p.lateNoted {
		return
	}
	var n int
	for _, it := range items {
		if it.renew && !it.leaseLost && !it.closing {
			n++
		}
	}
	if n > 0 {
		p.lateNoted = true
		p.m.leaseExtends.WithLabelValues(p.cfg.Name, "late").Add(float64(n))
		p.k.log.Debug("lease renewals late: the locks may lapse; the publish will check the token",
			"keys", n, "lease", p.lease, "since_last_renewal", p.now().Sub(p.leaseUntil.Add(-p.lease)).Round(time.Millisecond))
	}
}

// foldLeasesLocked marks lost the items whose lock a renewal found gone or taken, at a point where the batch decides what
// to do with them. Called with p.mu held, on the batch's goroutine: only it writes lost (the fail-safe reads it
// in a message on the loop while this goroutine waits for the answer).
func (p *pipeline) foldLeasesLocked(items []*item) {
	p.noteLateLeasesLocked(items)
	for _, it := range items {
		if it.leaseLost {
			it.lost = true
		}
	}
}

// closeLeases folds the leases' state into items and marks them closing: the fail-safe is about to run for them,
// and may delete their locks.
func (p *pipeline) closeLeases(items []*item) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.foldLeasesLocked(items)
	for _, it := range items {
		it.closing = true
	}
}

// releaseOwned releases every lock the batch still holds, or may hold after a transport error. It runs even when
// ctx was cancelled (shutdown past the grace period, an interrupted warmup), so that apps never wait out lock_ttl
// because of keepwarm; when Redis does not answer it retries (see releaseRetryFor), since commands sent before a
// freeze run when Redis wakes and would leave locks nobody releases.
func (p *pipeline) releaseOwned(ctx context.Context, items []*item) {
	var locks []string
	p.mu.Lock()
	for _, it := range items {
		if it.owned {
			locks = append(locks, it.ks.Lock)
			it.owned = false
		}
	}
	p.mu.Unlock()
	if len(locks) == 0 {
		return
	}
	if err := releaseLocks(ctx, p.rdb, locks, p.token); err != nil {
		p.k.log.Warn("release locks failed; they expire by themselves", "count", len(locks), "lease", p.lease,
			"error", err)
	}
}

// releaseLocks releases locks held with token (lockstep.ReleaseMany), retrying with jittered back-off until Redis
// answers: for at most releaseRetryFor; once ctx has ended, one last attempt bounded by releaseTimeout. It returns
// the last error.
func releaseLocks(ctx context.Context, rdb redis.UniversalClient, locks []string, token string) error {
	bg := context.WithoutCancel(ctx)
	deadline := time.Now().Add(releaseRetryFor)
	for attempt := 0; ; attempt++ {
		wait := backoff.Delay(attempt, releaseRetryBase, releaseRetryMax, rand.Float64())
		actx, cancel := context.WithTimeout(bg, releaseTimeout)
		err := lockstep.ReleaseMany(actx, rdb, locks, token)
		cancel()
		if err == nil || isErrorReply(err) {
			return err // answered: released, or refused for good (an error reply will not change on retry)
		}
		if ctx.Err() != nil || time.Now().Add(wait).After(deadline) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done(): // one last attempt, bounded by releaseTimeout, then give up
			t.Stop()
		}
	}
}

// warnRefusedKeys is how many keys of one batch warnRefused logs one by one; past that it logs one summary line
// with the first key, so that a Redis refusing everything (OOM) costs a line per batch, not per key.
const warnRefusedKeys = 3

// warnRefused logs, at WARN, the keys of one batch that Redis answered with an error reply: each with its key,
// reason and reply, or a summary when there are many.
func (k *keyspace) warnRefused(msg string, items []*item) {
	if len(items) <= warnRefusedKeys {
		for _, it := range items {
			k.log.Warn(msg, "key", it.ks.Cache, "reason", it.reason, "error", it.err)
		}
		return
	}
	it := items[0]
	k.log.Warn(msg, "keys", len(items), "first_key", it.ks.Cache, "reason", it.reason, "error", it.err)
}
