package warmer

import (
	"context"
	"errors"
	"time"

	"github.com/keepwarm/keepwarm/internal/backoff"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/warmer/internal/mailbox"
)

// retryBase is the first back-off after a failed or skipped refresh; it doubles per consecutive failure.
const retryBase = 500 * time.Millisecond

// lockedRecheckMin is the shortest wait before a key found locked by someone else is looked at again.
const lockedRecheckMin = 50 * time.Millisecond

// tryAgainDelay bounds the back-off after a TRYAGAIN reply (a Redis Cluster slot in migration, which lasts
// milliseconds to seconds): in [tryAgainDelay/2, tryAgainDelay), short, so that the key is published as soon as
// the slot has moved.
const tryAgainDelay = 100 * time.Millisecond

// resultSettled marks an item the re-check under the lock already dealt with (no longer hot, or no TTL): it is
// not a refresh and is not counted.
const resultSettled = "settled"

// refresh runs one batch of due hot keys through the pipeline (see pipeline) with the daemon's two additions:
// under the locks it re-reads PTTL so a key someone else just rebuilt is not rebuilt again, and when a key
// cannot be refreshed (origin failure, value too large) it keeps the current value alive (fail-safe). Then it
// reschedules every key.
func (k *keyspace) refresh(ctx context.Context, batch []batchKey) {
	k.refreshWith(ctx, batch, nil)
}

// errOriginFailing is the cause of the keys a fail-safe-only batch extended without an origin query.
var errOriginFailing = errors.New("warmer: not queried: the origin is failing and a probe query is in flight; value kept by the fail-safe")

// jitteredTTL returns the TTL draw for the values a batch writes with cfg: lockstep.Jitter, the apps' own
// formula, so TTL × (1 + U[0, Jitter)). The draw is safe for concurrent use (k.rnd has its own lock).
func (k *keyspace) jitteredTTL(cfg KeyspaceConfig) func() time.Duration {
	return func() time.Duration { return lockstep.Jitter(cfg.TTL, cfg.Jitter, k.rnd.Float64()) }
}

// refreshWith is refresh; a non-nil skipOrigin runs the batch without an origin query, straight to the fail-safe
// (pipeline.skipOrigin).
//
// It runs in its own goroutine, with no *loopState: every read or write of the loop's state (hot states
// included) is a message to the loop (recheck, failSafe, settle), which finds each item's hot state by its
// batchKey (hotOf).
func (k *keyspace) refreshWith(ctx context.Context, batch []batchKey, skipOrigin error) {
	cfg := k.config()
	start := k.w.now()
	items := make([]*item, 0, len(batch))
	for _, b := range batch {
		ks, err := cfg.Keys.For(b.id)
		if err != nil { // cannot happen for ids that passed ValidateID; drop the key rather than loop on it
			k.log.Warn("dropping hot id with no valid key", "id", b.id, "error", err)
			k.mail.Send(func(k *loopState) {
				if h := k.hotOf(b); h != nil {
					h.inflight, h.lastErr = false, err.Error()
				}
			})
			continue
		}
		items = append(items, &item{id: b.id, ks: ks, hot: b})
	}
	p := k.newPipeline(cfg, k.jitteredTTL(cfg))
	p.recheck = k.recheck
	p.failSafe = func(ctx context.Context, items []*item) { k.failSafe(ctx, p.cfg, p.token, items) }
	p.failSafeUnlocked = func(ctx context.Context, items []*item) { k.failSafeUnlocked(ctx, p.cfg, items) }
	p.skipOrigin = skipOrigin
	err := p.run(ctx, items)
	if err != nil && ctx.Err() == nil && !errors.Is(err, context.Canceled) {
		k.redisError(ctx, "refresh", err)
	}
	k.settle(p, items, err)
	k.w.m.refreshSeconds.WithLabelValues(cfg.Name).Observe(k.w.now().Sub(start).Seconds())
}

// settle hands the batch's items back to the loop, which records each result in its hot state and reschedules it.
func (k *keyspace) settle(p *pipeline, items []*item, runErr error) {
	now := k.w.now()
	k.mail.Send(func(k *loopState) { k.settleAll(p, items, runErr, now) })
}

// settleAll is settle's message, on the loop.
func (k *loopState) settleAll(p *pipeline, items []*item, runErr error, now time.Time) {
	k.streak.noteBatch(items, runErr, now)
	s := k.streak
	k.failing.Store(&s) // for RefreshFailing
	for _, it := range items {
		k.settleOne(p, it, runErr, now)
		if h := k.hotOf(it.hot); h != nil && h.pendingGone != "" {
			// A gone event arrived while the refresh was in flight: read the key again and judge it then.
			h.needPTTL, h.goneEvent, h.pendingGone = true, h.pendingGone, ""
			if h.flushCounted {
				h.counted = true // the flush's gap is counted; a value the batch wrote before it is that gap too
			}
			k.adopt = append(k.adopt, h)
		}
	}
}

// settleOne records one item's result in its hot state and reschedules it.
func (k *loopState) settleOne(p *pipeline, it *item, runErr error, now time.Time) {
	cfg := p.cfg
	h := k.hotOf(it.hot)
	if runErr != nil && it.result == "" {
		// The batch could not run (Redis failed, or shutdown): try again after a back-off.
		if ctxErr := errors.Is(runErr, context.Canceled) || errors.Is(runErr, context.DeadlineExceeded); !ctxErr {
			it.fail(redisReason(runErr), runErr)
			k.countItem(it)
			if h != nil {
				h.lastErr = runErr.Error()
				h.errors++
			}
		}
		if h != nil {
			h.inflight = false
			k.retry(h, retryBase)
		}
		return
	}
	if it.result != "" && it.result != ResultFresh && it.result != resultSettled {
		k.countItem(it)
	}
	if h == nil {
		return // no longer hot since the batch was formed: counted, and left to expire
	}
	h.inflight = false
	switch it.result {
	case ResultLockGone:
		if h.pendingGone == "flush" || h.pendingGone == "failover" {
			// A flush (or failover) noticed while the batch was in flight took the lock with the value: not an
			// invalidation. settleAll has the key re-read, judged against the expiry known before the flush.
			break
		}
		// The lock vanished while our lease was valid: an app invalidated the key (lockstep.Invalidate deletes
		// the value and the lock) after our origin query read the old row. An invalidation, not an SLO miss;
		// rebuild it at once, so that the new row is cached within one refresh, not one recheck later. Unless a
		// flush the canary has not noticed yet took the lock: rereadOwned looks at lockGoneAt then.
		if !h.expiry.IsZero() && now.After(h.expiry.Add(expiryTolerance)) && !h.counted {
			k.notCounted(h, now, "its lock vanished while the lease held: taken for an invalidation")
		}
		h.lockGoneAt, h.lockGoneExpiry, h.lockGoneLearned = now, h.expiry, h.learnedAt
		h.invalidated = true
		h.needPTTL = false
		h.expiry = time.Time{}
		k.q.schedule(h, now)
	case ResultLocked:
		// An app or another replica is rebuilding it: look again soon, by which time the new value is there
		// (or the key is due at once). Soon is a small part of the lead, so that when the other rebuild fails
		// (its origin query did) there is still time to refresh. Its PTTL is read meanwhile, so that an
		// expiry while the other holder keeps the lock, and each value it writes, are seen and judged.
		h.needPTTL = true
		k.adopt = append(k.adopt, h)
		k.q.schedule(h, now.Add(max(lockedRecheckMin, min(cfg.LockTTL/2, time.Second, k.lead(h)/8))))
	case ResultLockLost:
		if it.err != nil {
			h.lastErr = it.err.Error()
		}
		// Taken by another token, or lapsed while Redis or this process stalled: what became of the value is
		// not known, so it is read and judged (gone past its known expiry, it was missed, whoever holds the lock
		// now), as for a lock found held. Before, the retry alone followed: a key whose lease lapsed in a Redis
		// pause, its value expiring meanwhile, was left to a later publish to judge. Seed 6006's album:279 (14.45 s
		// in a 16.1 s SIGSTOP, counted by nobody) is probably one: its owner logged one album lock's renewal
		// failing at the pause.
		h.needPTTL = true
		k.adopt = append(k.adopt, h)
		k.retry(h, retryBase)
	case ResultError, ResultTooLarge:
		if it.err != nil {
			h.lastErr = it.err.Error()
		}
		if it.rescheduled { // the fail-safe reschedules the keys it handled
			return
		}
		h.errors++
		if it.reason == ReasonTryAgain {
			k.retryAt(h, backoff.Delay(0, tryAgainDelay, tryAgainDelay, k.rnd.Float64()))
			return
		}
		k.retry(h, retryBase)
	case ResultMissing:
		h.missing = true
		h.lastErr = ""
		h.lastRefresh = p.start
		if it.delete || cfg.Missing == MissingKeep {
			h.expiry = time.Time{}
			k.q.schedule(h, now.Add(cfg.TTL)) // look again in one TTL, not at once
			return
		}
		h.expiry, h.learnedAt = p.start.Add(it.ttl), p.start // tombstone
		k.markOwnWrite(h, now)
		k.schedule(h)
	case ResultOK:
		switch {
		case it.prevUnknown:
			if !h.expiry.IsZero() && p.start.After(h.expiry.Add(expiryTolerance)) && !h.counted {
				k.notCounted(h, p.start, "a re-sent publish wrote it; the value it replaced is unknown")
			}
		case it.prevTTL == lockstep.PrevGone:
			// The publish found the value already gone: an expiry the periodic check may never have seen.
			k.noteHandover(h, pttlGone, now)
			k.noteGone(h, now)
		default:
			// The value it replaced: the daemon's own, or someone's rebuild after the known expiry (a miss).
			k.judgeReplaced(h, p.start, it.prevTTL)
		}
		if !it.prevUnknown {
			k.w.m.leadSeconds.WithLabelValues(cfg.Name).Observe(max(it.prevTTL, 0).Seconds())
		}
		k.judge(h, p.start)
		h.handover = false
		h.lastRefresh = p.start
		h.refreshFoundValue = !it.prevUnknown && it.prevTTL > 0
		h.lastErr = ""
		h.errors = 0
		h.counted = false
		h.invalidated = false
		h.shortNotice = false
		h.needPTTL = false
		h.missing = false
		h.observeRebuild(p.rebuild)
		k.p95.add(p.rebuild)
		h.expiry, h.learnedAt = p.start.Add(it.ttl), p.start
		k.markOwnWrite(h, now)
		k.schedule(h)
	}
}

// countItem records it's result, and for an error its reason, in the metrics and the keyspace's counters.
func (k *keyspace) countItem(it *item) {
	k.count(it.result)
	if it.result == ResultError && it.reason != "" {
		k.w.m.refreshErrors.WithLabelValues(k.name, it.reason).Inc()
	}
}

// recheck decides, under the locks, which owned keys really need the origin: a key that someone else refreshed
// since the daemon last looked is only rescheduled ("fresh"), a key without TTL is reported and left alone, and
// a key no longer hot is dropped. It reads the PTTLs in one pipelined round trip. A trusted key (reconcile.go:
// the daemon's own write, with notifications healthy since) needs no PTTL: nobody rewrote it, or the
// notification of that write would have made it untrusted.
//
// It runs in the batch's goroutine; its reads and writes of the hot states are two messages to the loop
// (mailbox.Call), one before the PTTLs are read and one after.
func (k *keyspace) recheck(ctx context.Context, items []*item) ([]*item, error) {
	cfg := k.config()
	// The messages write the items (result), which settle reads: they are waited for even past ctx's end.
	sctx := context.WithoutCancel(ctx)
	type split struct{ trusted, asked []*item }
	first, err := mailbox.Call(sctx, k.mail, func(k *loopState) (s split) {
		for _, it := range items {
			switch h := k.hotOf(it.hot); {
			case h == nil:
				it.result = resultSettled // no longer hot since the batch was formed: leave it to expire
			case k.trusted(h):
				s.trusted = append(s.trusted, it)
			default:
				s.asked = append(s.asked, it)
			}
		}
		return s
	})
	if err != nil {
		return nil, err
	}
	if len(first.asked) == 0 {
		return first.trusted, nil
	}
	ttls, err := k.pttls(ctx, cfg.Keys, idsOf(first.asked))
	if err != nil {
		return nil, err
	}
	now := k.w.now()
	return mailbox.Call(sctx, k.mail, func(k *loopState) []*item {
		return k.recheckAfter(first.asked, ttls, now, first.trusted)
	})
}

// recheckAfter is recheck's second message, on the loop: it judges each PTTL read and returns out with the items
// that need the origin appended.
func (k *loopState) recheckAfter(asked []*item, ttls []time.Duration, now time.Time, out []*item) []*item {
	for i, it := range asked {
		it.pttl = ttls[i]
		h := k.hotOf(it.hot)
		if h == nil {
			it.result = resultSettled // no longer hot since the batch was formed: leave it to expire
			continue
		}
		ld := k.lead(h)
		switch {
		case it.pttl == pttlPersistent:
			it.result = resultSettled
			k.applyPTTL(h, it.pttl, now)
		case it.pttl > ld+ld/2 && !h.missing:
			// Someone else refreshed it since we last looked: do not rebuild it twice within one TTL. If that was
			// after the value the daemon knew had expired, the key was missed (an app held the lock past it).
			it.result = ResultFresh
			k.count(ResultFresh)
			k.judgeReading(h, now, it.pttl, "rebuilt by another writer after it expired")
			h.counted, h.invalidated, h.handover = false, false, false
			h.needPTTL = false
			h.shortNotice = false
			h.ownWrite = false
			h.expiry, h.learnedAt = now.Add(it.pttl), now
			k.schedule(h)
			k.scheduleCheck(h, now)
		default:
			if it.pttl < 0 {
				k.noteHandover(h, it.pttl, now)
				k.noteGone(h, now)
			}
			out = append(out, it)
		}
	}
	return out
}

// failSafe keeps hot values alive that cannot be refreshed now (the origin failed, or the new value is too
// large): rather than let them expire into a stampede against a sick database, it extends each current value's
// TTL under the lock until the next retry (lockstep.ExtendValueMany). The bound is fleet-wide: no value outlives
// its last good expiry by more than max_stale, however many daemons extend it, because the start of staleness
// is kept in Redis. Items keep their result (error or too_large); each is rescheduled with back-off (see
// keepAlive).
func (k *keyspace) failSafe(ctx context.Context, cfg KeyspaceConfig, token string, items []*item) {
	k.keepAlive(ctx, cfg, items, FailSafeLocked, func(sets []lockstep.KeySet, ttl time.Duration) ([]lockstep.Extended, error) {
		return lockstep.ExtendValueMany(ctx, k.w.rdb, sets, token, ttl, cfg.MaxStale)
	})
}

// failSafeUnlocked is the fail-safe for items whose lock Redis refused for memory (OOM: maxmemory reached with
// noeviction, so no new key, and no lock, can be written): no process can rebuild them into Redis until it takes
// writes again, so rather than let them expire it extends each current value's TTL without a lock
// (lockstep.ExtendValueUnlockedMany: nothing while a lock exists, no value written, the same max_stale bound).
// Each item keeps its result (error, reason oom) and is retried with back-off, inside the extended life (see
// keepAlive), so that a Redis that stays full costs one lock attempt and one extension per key per back-off.
// The first batch of an OOM episode logs why, once (oomExtending).
func (k *keyspace) failSafeUnlocked(ctx context.Context, cfg KeyspaceConfig, items []*item) {
	k.oomExtending(cfg, items[0].err)
	k.keepAlive(ctx, cfg, items, FailSafeUnlocked, func(sets []lockstep.KeySet, ttl time.Duration) ([]lockstep.Extended, error) {
		return lockstep.ExtendValueUnlockedMany(ctx, k.w.rdb, sets, ttl, cfg.MaxStale)
	})
}

// keepAlive extends the items' current values with extend (one call per wanted TTL) and reschedules them. The
// extension and the retry come from one decision: the back-off delay is drawn once per key (one uniform draw per
// batch), the value is extended to delay + lead + one origin query's bound, and the retry is queued at delay
// (brought forward when the bound clipped the extension, see retryAt), so the retry always lands inside the
// extended life. Two independent draws let the retry fall after the value had expired (447 of 734 hot keys
// expired in a 150 s PostgreSQL outage). A value the extension finds already gone is counted as an SLO miss.
// mode labels the extensions in keepwarm_warmer_failsafe_extensions_total.
func (k *keyspace) keepAlive(ctx context.Context, cfg KeyspaceConfig, items []*item, mode string,
	extend func(sets []lockstep.KeySet, ttl time.Duration) ([]lockstep.Extended, error)) {
	now := k.w.now()
	u := k.rnd.Float64()
	// The hot states are the loop's: the draws, the extensions' results and the reschedules are messages to it.
	// Sent with Call on a context that survives ctx's end (the keys are settled even when the batch is cut short).
	sctx := context.WithoutCancel(ctx)
	type plan struct {
		delays map[*item]time.Duration
		byTTL  map[time.Duration][]*item
	}
	pl, _ := mailbox.Call(sctx, k.mail, func(k *loopState) plan {
		pl := plan{delays: make(map[*item]time.Duration, len(items)), byTTL: map[time.Duration][]*item{}}
		for _, it := range items {
			h := k.hotOf(it.hot)
			if h == nil {
				h = &hotState{id: it.id} // no longer hot: its value is still kept alive like the others'
			}
			h.errors++
			pl.delays[it] = k.retryDelayDraw(h, retryBase, u)
			if it.lost {
				continue
			}
			// The retry at delay may itself hang for a whole origin query (queryBound) before its own fail-safe:
			// the extension covers that too, so that a retry against a sick origin still lands inside it.
			want := pl.delays[it] + k.lead(h) + cfg.queryBound()
			pl.byTTL[want] = append(pl.byTTL[want], it)
		}
		return pl
	})
	delays, byTTL := pl.delays, pl.byTTL

	for ttl, group := range byTTL { // one group per consecutive-error count
		sets := make([]lockstep.KeySet, len(group))
		for i, it := range group {
			sets[i] = it.ks
		}
		res, err := extend(sets, ttl)
		if err != nil {
			k.redisError(ctx, "fail-safe extend", err)
			continue // the items stay owned: the batch releases their locks
		}
		_ = mailbox.Do(sctx, k.mail, func(k *loopState) { k.failSafeApplied(cfg, group, res, now, mode) })
	}
	_ = mailbox.Do(sctx, k.mail, func(k *loopState) {
		for _, it := range items {
			it.rescheduled = true
			if h := k.hotOf(it.hot); h != nil {
				k.retryAt(h, delays[it])
			}
		}
	})
}

// failSafeApplied folds one group's extension results into the items and their hot states, on the loop; mode
// labels the extensions counted.
func (k *loopState) failSafeApplied(cfg KeyspaceConfig, group []*item, res []lockstep.Extended, now time.Time, mode string) {
	for i, it := range group {
		r := res[i]
		h := k.hotOf(it.hot)
		if h == nil {
			h = &hotState{id: it.id} // no longer hot: what is learnt of it is not kept
		}
		switch {
		case r.Err == nil:
			h.expiry = now.Add(r.TTL)
			k.w.m.failSafe.WithLabelValues(cfg.Name, mode).Inc()
			it.owned = false
		case errors.Is(r.Err, lockstep.ErrStaleLimit):
			it.owned = false // past max_stale: left to expire on its TTL
			if r.TTL > 0 {
				h.expiry = now.Add(r.TTL)
			}
		case errors.Is(r.Err, lockstep.ErrNotFound):
			it.owned = false // the script released the lock: the value was already gone
			k.noteGone(h, now)
			h.expiry = time.Time{}
		case errors.Is(r.Err, lockstep.ErrLockLost):
			it.owned = false // not ours any more
		case errors.Is(r.Err, lockstep.ErrLockHeld):
			// Without a lock (FailSafeUnlocked): an app or another daemon holds the key's lock and is rebuilding
			// it; its publish decides. Retried with the others.
		default: // an error reply: nothing touched, the lock is still ours and is released by the batch
			k.log.Warn("fail-safe extension refused by Redis", "key", it.ks.Cache, "error", r.Err)
		}
	}
}
