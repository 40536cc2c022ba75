package warmer

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/keepwarm/keepwarm/internal/backoff"
)

// loop is the keyspace's scheduler: it takes the loop's state from the mailbox and runs it until ctx ends.
func (k *keyspace) loop(ctx, workCtx context.Context) {
	s := k.mail.Activate()
	defer k.mail.Deactivate()
	s.run(ctx, workCtx)
}

// run reads the hot-key signals, learns expiries, and dispatches due keys to refresh batches within the origin
// budget, until ctx ends.
func (k *loopState) run(ctx, workCtx context.Context) {
	k.mail.Drain() // sent before it owned the state: ran already (see mailbox); nothing is queued
	cfg := k.cfg
	k.log.Info("keyspace scheduler started", "key", cfg.Keys.Cache.String(), "ttl", cfg.TTL,
		"refresh_ahead", cfg.RefreshAhead, "top_n", cfg.TopN, "pinned", len(cfg.Pinned))
	k.checkLFU(ctx)
	k.poll(ctx)
	poll := k.w.cfg.Clock.NewTicker(cfg.PollInterval)
	defer poll.Stop()
	reconcile := k.w.cfg.Clock.NewTicker(reconcileTick(cfg))
	defer reconcile.Stop()
	timer := k.w.cfg.Clock.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		k.mail.Drain()
		k.learnExpiries(ctx)
		wait := k.dispatch(ctx, workCtx)
		k.w.tick()
		timer.Reset(wait)
		for idle := true; idle; {
			idle = false
			select {
			case <-ctx.Done():
				return
			case <-timer.Chan():
			case <-k.wake:
			case <-k.mail.Wake():
				// Messages (a batch's re-check or settle, an event) run at once, but a full pass (PTTL reads,
				// dispatch) follows only when they left work for now: a key to read, or one due now. A pass on
				// every message would dispatch keys as soon as they entered the gather window, in smaller
				// batches, at about three times the round trips per refresh (the scale benchmark). A batch that
				// ends still pokes the loop (dispatch).
				k.mail.Drain()
				now := k.w.now()
				if !k.passWanted(now) {
					timer.Reset(k.nextWait(now))
					idle = true
				}
			case <-poll.Chan():
				k.poll(ctx)
			case <-reconcile.Chan():
				k.reconcile(ctx)
			}
		}
		k.mail.Drain()
		if c := k.cfg; c.PollInterval != cfg.PollInterval || reconcileTick(c) != reconcileTick(cfg) {
			cfg = c
			poll.Reset(cfg.PollInterval)
			reconcile.Reset(reconcileTick(cfg))
		}
	}
}

// dispatch starts refresh batches for the due keys while the origin budget has room, and returns how long to
// sleep until the next key falls due.
func (k *loopState) dispatch(ctx, workCtx context.Context) time.Duration {
	now := k.w.now()
	cfg := k.cfg
	gather := k.gatherWindow()
	failing := k.origin.failing()
	for ctx.Err() == nil && k.q.dueBy(now.Add(gather)) {
		// While the origin fails, one batch at a time probes it (like a circuit breaker's half-open state); the
		// other due keys are kept by the fail-safe without a query (failSafeOnly, below).
		slot := (!failing || k.probes == 0) && k.slots.tryAcquire()
		if !slot && (k.failSafeBusy || !k.q.dueBy(now) || !failing) {
			break
		}
		var batch []*hotState
		if slot {
			batch = k.q.popDue(now.Add(gather), cfg.BatchSize)
		} else {
			// The origin's last query failed and a probe is in flight (or every origin slot is taken): queries may
			// hang until their timeout, and keys waiting behind them would expire before a fail-safe could extend
			// them. Keys due now are extended at once, in one Redis-only batch at a time (skipOrigin).
			batch = k.q.popDue(now, cfg.BatchSize)
		}
		if batch = slices.DeleteFunc(batch, func(h *hotState) bool { return !k.owns(h.id) }); len(batch) == 0 {
			if slot {
				k.slots.release() // only keys another replica owns now: dropped from the queue
			}
			continue
		}
		for _, h := range batch {
			h.inflight = true
		}
		k.batches.Add(1)
		ks, keys := k.keyspace, k.batchKeys(batch) // the batch goroutine gets no *loopState
		if !slot {
			k.failSafeBusy = true
			go func() {
				defer ks.batches.Done()
				ks.refreshWith(workCtx, keys, errOriginFailing)
				ks.mail.Send(func(k *loopState) { k.failSafeBusy = false })
				ks.poke()
			}()
			continue
		}
		k.probes++
		go func() {
			defer ks.batches.Done()
			ks.refresh(workCtx, keys)
			ks.slots.release()
			ks.mail.Send(func(k *loopState) { k.probes-- })
			ks.poke()
		}()
	}
	// The gauge of due keys: counted in O(due keys), and at most every dueGaugeEvery, since dispatch runs after
	// every batch. Scanning the whole queue here made each batch cost O(hot keys): at 300,000 pinned keys one
	// daemon refreshed 2,268 keys/s and fell behind (docs/benchmarks.md, fleet-scale).
	if now.Sub(k.dueGaugeAt) >= dueGaugeEvery || now.Before(k.dueGaugeAt) {
		k.dueGaugeAt = now
		k.w.m.queued.WithLabelValues(cfg.Name).Set(float64(k.q.countBy(now)))
	}
	return k.nextWait(now)
}

// dueGaugeEvery is how often at most dispatch recounts keepwarm_warmer_keys_due.
const dueGaugeEvery = 250 * time.Millisecond

// nextWait is how long the loop may sleep at now until the next key falls due.
func (k *loopState) nextWait(now time.Time) time.Duration {
	next := k.q.peek()
	if next == nil {
		return time.Hour
	}
	if d := next.due.Sub(now); d > 0 {
		return d
	}
	// Due now but no budget: a finishing batch pokes the loop; re-check soon in any case.
	return 50 * time.Millisecond
}

// passWanted reports whether the messages just run left work for a full pass of the loop at now: a key whose
// PTTL is to be read (adopt) or a key due now.
func (k *loopState) passWanted(now time.Time) bool {
	if len(k.adopt) > 0 || len(k.left) > 0 {
		return true
	}
	next := k.q.peek()
	return next != nil && !next.due.After(now)
}

// dueAt returns when a key expiring at expiry should be refreshed: expiry − lead − an XFetch-style early offset.
// The offset is δ·β·(−ln u) with δ the rebuild estimate, β = 1 and u in (0,1], i.e. the moment at which XFetch's
// test "now − δβ·ln(u) ≥ expiry" first holds for one draw (Vattani, Chierichetti, Lowenstein, "Optimal
// Probabilistic Cache Stampede Prevention", VLDB 2015). Several daemon replicas draw different u and so do not
// collide on the same key at the same instant. The offset is capped at lead/2 so the spread never doubles the
// lead.
func dueAt(expiry time.Time, ld, rebuild time.Duration, u float64) time.Time {
	if u <= 0 || u > 1 {
		u = 1
	}
	early := time.Duration(float64(rebuild) * -math.Log(u))
	early = min(early, ld/2)
	return expiry.Add(-ld - early)
}

// schedule queues h for its next refresh given its known expiry.
func (k *loopState) schedule(h *hotState) {
	if h.e.hot != h || h.persistent || !k.owns(h.id) {
		return
	}
	now := k.w.now()
	if h.expiry.IsZero() {
		k.q.schedule(h, now)
		return
	}
	k.q.schedule(h, dueAt(h.expiry, k.lead(h), k.rebuildEstimate(h), 1-k.rnd.Float64()))
}

// rebuildEstimate is h's rebuild p95, or the keyspace's for a key not rebuilt yet.
func (k *loopState) rebuildEstimate(h *hotState) time.Duration {
	if h.rebuildP95 > 0 {
		return h.rebuildP95
	}
	return k.p95.p95()
}

// lead is how long before its expiry h is refreshed: the one place where the lead is computed (see
// KeyspaceConfig.Lead), used by the scheduler, the re-check under the lock, the short-notice test and the
// fail-safe alike.
func (k *loopState) lead(h *hotState) time.Duration {
	return k.cfg.Lead(k.rebuildEstimate(h))
}

// retryMargin is how long before a key's known expiry its last retry is started, beyond its rebuild estimate.
const retryMargin = 100 * time.Millisecond

// retry queues h for another attempt after retryDelay (see retryAt).
func (k *loopState) retry(h *hotState, base time.Duration) {
	k.retryAt(h, k.retryDelay(h, base))
}

// retryAt queues h for another attempt after delay, but never after its known expiry: while the value is
// still there, the attempt is brought forward to expiry − rebuild estimate − retryMargin (at least
// lockedRecheckMin from now), so that a back-off drawn for a transient failure (TRYAGAIN, ASK, MOVED,
// CLUSTERDOWN, a lock held elsewhere) cannot carry the retry past the moment the value expires. A key whose value
// has expired already (or is unknown) keeps the full back-off.
func (k *loopState) retryAt(h *hotState, delay time.Duration) {
	if h.e.hot != h || !k.owns(h.id) {
		return
	}
	now := k.w.now()
	k.q.schedule(h, retryAt(now, delay, h.expiry, k.rebuildEstimate(h)))
}

// retryAt is retryAt's rule: now + delay, capped for a value that expires at expiry (zero: unknown) and takes
// rebuild to rebuild.
func retryAt(now time.Time, delay time.Duration, expiry time.Time, rebuild time.Duration) time.Time {
	at := now.Add(delay)
	if expiry.IsZero() || !expiry.After(now) {
		return at
	}
	latest := expiry.Add(-rebuild - retryMargin)
	if floor := now.Add(lockedRecheckMin); latest.Before(floor) {
		latest = floor
	}
	if at.After(latest) {
		return latest
	}
	return at
}

// retryDelay is the back-off before another attempt at h (backoff.Delay, the daemon's one formula): in
// [base, 2·base) doubled per consecutive error of h, capped at max(TTL/2, 1s), jittered so that keys that failed
// together (and replicas) do not retry in step.
func (k *loopState) retryDelay(h *hotState, base time.Duration) time.Duration {
	return k.retryDelayDraw(h, base, k.rnd.Float64())
}

// retryDelayDraw is retryDelay with the uniform draw u in [0, 1) given: the fail-safe draws once per
// batch (failSafe).
func (k *loopState) retryDelayDraw(h *hotState, base time.Duration, u float64) time.Duration {
	return backoff.Delay(h.errors+1, base, max(k.cfg.TTL/2, time.Second), u)
}

// rebuildWindow keeps the last rebuild durations of a keyspace for a keyspace-wide p95, used for keys that have
// not been rebuilt yet.
type rebuildWindow struct {
	buf    [128]time.Duration
	n, i   int
	cached time.Duration
	dirty  bool
}

func (r *rebuildWindow) add(d time.Duration) {
	r.buf[r.i] = d
	r.i = (r.i + 1) % len(r.buf)
	if r.n < len(r.buf) {
		r.n++
	}
	r.dirty = true
}

func (r *rebuildWindow) p95() time.Duration {
	if r.n == 0 || !r.dirty {
		return r.cached
	}
	s := make([]time.Duration, r.n)
	copy(s, r.buf[:r.n])
	slices.Sort(s)
	r.cached, r.dirty = s[(len(s)*95)/100], false
	return r.cached
}
