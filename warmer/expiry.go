package warmer

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/lockstep"
)

// pttlChunk is how many PTTLs go in one pipeline.
const pttlChunk = 1000

// expiryTolerance absorbs the difference between the daemon's conservative expiry estimate (taken before the
// publish was sent) and Redis's own clock.
const expiryTolerance = 250 * time.Millisecond

// PTTL replies with special meanings.
const (
	pttlGone       = time.Duration(-2) // the key does not exist (go-redis returns the raw -2)
	pttlPersistent = time.Duration(-1) // the key has no TTL (go-redis returns the raw -1)
)

// pttls reads the PTTL of each id's cache key, pipelined in chunks. A nil slice means Redis failed.
func (k *keyspace) pttls(ctx context.Context, keys *lockstep.Keys, ids []string) ([]time.Duration, error) {
	out := make([]time.Duration, len(ids))
	for start := 0; start < len(ids); start += pttlChunk {
		end := min(start+pttlChunk, len(ids))
		pipe := k.w.rdb.Pipeline()
		cmds := make([]*redis.DurationCmd, end-start)
		for i, id := range ids[start:end] {
			ks, err := keys.For(id)
			if err != nil {
				cmds[i] = nil
				continue
			}
			cmds[i] = pipe.PTTL(ctx, ks.Cache)
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		for i, c := range cmds {
			if c == nil {
				out[start+i] = pttlGone
				continue
			}
			out[start+i] = c.Val()
		}
	}
	return out, nil
}

// learnExpiries reads the PTTL of newly hot keys (and of keys an app wrote, learnt from notifications) and
// schedules them: a missing key is due now, a key without TTL is reported and left alone.
func (k *loopState) learnExpiries(ctx context.Context) {
	var hs []*hotState
	for _, h := range k.adopt {
		if h.e.hot == h && h.needPTTL && !h.inflight && k.owns(h.id) {
			hs = append(hs, h)
		}
	}
	k.adopt = k.adopt[:0]
	// Keys of an expired, evicted or del event (onEvent), or of a flush, are read apart, so that a key really
	// gone counts as a miss (or as an invalidation, for a del), and a key that MIGRATE moved to another node, or
	// that a stale node reported, counts as nothing.
	var deleted []*hotState
	hs = slices.DeleteFunc(hs, func(h *hotState) bool {
		if h.goneEvent != "" {
			deleted = append(deleted, h)
			return true
		}
		return false
	})
	// Every reading is judged: a key whose expiry the daemon knew and that is found gone is a miss (a newly hot
	// key's expiry is not known yet, so its first reading never counts).
	for _, batch := range [][]*hotState{hs, deleted} {
		if !k.readPTTLs(ctx, batch, "read PTTL of new hot keys") {
			k.adopt = append(k.adopt, batch...) // try again on the next pass
		}
	}
	k.judgeLeft(ctx)
}

// judgeLeft reads the keys that left the hot set after their known expiry (setHot) and judges each reading as
// the last of its hot spell: gone, or rebuilt by someone else since that expiry, it was missed while hot. A Redis
// pause let such keys expire unrefreshed, and the first access-set poll after it dropped them (no reads were
// recorded meanwhile) before any reading: the observer saw gaps of 6–9 s that no replica counted.
func (k *loopState) judgeLeft(ctx context.Context) {
	if len(k.left) == 0 {
		return
	}
	hs := k.left
	ids := make([]string, len(hs))
	for i, h := range hs {
		ids[i] = h.id
	}
	now := k.w.now()
	ttls, err := k.pttls(ctx, k.cfg.Keys, ids)
	if err != nil {
		k.redisError(ctx, "read PTTL of keys that left the hot set", err)
		return // read on the next pass
	}
	k.redisOK()
	k.left = nil
	for i, h := range hs {
		k.judgeReplaced(h, now, ttls[i])
	}
}

// readPTTLs reads the PTTL of hs (pipelined) and folds each reading into its key's state and schedule, skipping
// keys that stopped being hot or went in flight meanwhile. It reports false when Redis failed (logged once per
// outage as what).
func (k *loopState) readPTTLs(ctx context.Context, hs []*hotState, what string) bool {
	if len(hs) == 0 {
		return true
	}
	ids := make([]string, len(hs))
	for i, h := range hs {
		ids[i] = h.id
	}
	keys := k.cfg.Keys
	now := k.w.now()
	epoch := k.w.trust.epoch.Load() // a reading confirms an own write only if no notification was missed since
	ttls, err := k.pttls(ctx, keys, ids)
	if err != nil {
		k.redisError(ctx, what, err)
		return false
	}
	k.redisOK()
	for i, h := range hs {
		// No write can settle while the loop reads (settles are messages to it), so no reading is staler than
		// the daemon's own last write; a key in flight is settled by its batch.
		if h.e.hot != h || h.inflight {
			if h.e.hot == h && h.cidx < 0 {
				k.scheduleCheck(h, now) // its refresh settles it; keep it in the check queue meanwhile
			}
			continue
		}
		if h.goneEvent == "expired" && ttls[i] == pttlGone && !h.expiry.IsZero() {
			h.expiry = minTime(h.expiry, now) // Redis expired it: an SLO miss even if the estimate was later
		}
		if (h.goneEvent == "expired" || h.goneEvent == "evicted") && ttls[i] == pttlGone && h.expiry.IsZero() &&
			!h.missing && !h.counted {
			// A key whose expiry this replica never learnt (newly hot or newly owned, its first reading found it
			// gone or is still to come) that Redis announced expired or evicted while it was hot and owned here:
			// it existed while hot, so it was missed, not a cold start. A kill -9 test beside stress-ng saw two
			// keys turn hot on their owner 10 and 40 ms before they expired, missing 330 and 576 ms, counted by
			// nobody. An announcement of an expiry from just before the key turned hot, delivered after, counts
			// too: the counter errs high there.
			h.expiry, h.learnedAt = now, now
		}
		if h.goneEvent == "del" && ttls[i] == pttlGone {
			h.invalidated = true // an app's (or the change stream's) invalidation: excluded from the SLO
		}
		if !h.flushedSince.IsZero() && ttls[i] > 0 && !h.expiry.IsZero() && !h.counted && !h.missing &&
			(!h.lastRefresh.After(h.flushedSince) || h.refreshFoundValue) && !h.missedAt.After(h.flushedSince) {
			// Redis was emptied after flushedSince, so whatever is there now was written after the flush; the
			// daemon has not written it since (its own publish would have found the key gone and counted it).
			// Another writer rebuilt the key after the flush removed the value the daemon knew: a miss, however
			// short, even when the daemon learnt that writer's value (a "set" notification) before the canary
			// told it of the flush. A 10-minute soak left 116 such gaps after three Redis restarts uncounted.
			// Unless the key's miss since then was counted already: a reading between the flush and the
			// rebuild found it gone (TestFlushCountsAKeyAnAppRebuiltBeforeTheReread counted 4 for 3 once).
			// The daemon's own refresh since the canary last saw Redis full is no excuse when its publish found
			// a value there: published before the flush, its value was flushed; after it, the value it found was
			// a rebuild after the flush (a publish that found the key gone counted it then: missedAt). Seed 6006
			// left two such gaps uncounted (chart:genre:6 188 ms, album:93 270 ms).
			k.countMiss(h, now, "rebuilt by another writer after a flush")
		}
		if !h.expiredHeard.IsZero() && ttls[i] > 0 && !h.expiry.IsZero() &&
			!h.expiredHeard.Before(h.expiry.Add(-expiryTolerance)) &&
			absDur(now.Add(ttls[i]).Sub(h.expiry)) > expiryTolerance {
			// Redis announced the expiry of the value the daemon knew (heard at or after it), and a new value is
			// there: someone rebuilt the key after it expired. A miss, even when the reading came within
			// expiryTolerance of that expiry, where the reading alone cannot tell (judgeReading). Seed 7201:
			// album:21 rebuilt by an app 134 ms after its expiry, read 231 ms after it, counted by nobody.
			k.judgeAnnounced(h, now, ttls[i])
		}
		h.flushedSince, h.expiredHeard = time.Time{}, time.Time{}
		h.needPTTL, h.goneEvent = false, ""
		k.noteHandover(h, ttls[i], now)
		prev := h.expiry
		k.applyPTTL(h, ttls[i], now)
		if h.ownWrite && ttls[i] > 0 && absDur(h.expiry.Sub(prev)) <= expiryTolerance {
			h.notifyEpoch = epoch // the daemon's own value, confirmed: trusted again while notifications stay healthy
		} else {
			h.ownWrite = false
		}
		k.scheduleCheck(h, now)
	}
	return true
}

// setPersistent records whether h has no TTL (an app's key keepwarm never overwrites), and updates the gauges when
// that changes: a pinned-only keyspace's polls leave them alone (poll), so nothing else would.
func (k *loopState) setPersistent(h *hotState, p bool) {
	if h.persistent != p {
		h.persistent = p
		k.gauges()
	}
}

// applyPTTL folds a PTTL reading taken at now into h's state and schedule. Every reading is judged against
// the expiry the daemon knew: a key found gone is a miss unless it was invalidated or its expiry was never known
// (noteGone); a value found present after that expiry had passed was rebuilt by someone else after it
// expired, which is a miss even though the key is there now (judgeReading).
func (k *loopState) applyPTTL(h *hotState, pttl time.Duration, now time.Time) {
	if h.flushCounted {
		// The re-read after a flush that was counted at once (rereadOwned): gone, it is that gap; present, its
		// value is a new one, whose own loss would count.
		h.flushCounted = false
		if pttl >= 0 {
			defer func() { h.counted = false }()
		}
	}
	switch {
	case pttl == pttlPersistent:
		if !h.persistent {
			k.log.Warn("hot key has no TTL; keepwarm will not overwrite it", "id", h.id)
		}
		k.setPersistent(h, true)
		k.q.remove(h)
	case pttl < 0: // gone
		k.setPersistent(h, false)
		k.noteGone(h, now)
		h.expiry = time.Time{}
		if h.idx < 0 || h.due.After(now.Add(time.Second)) {
			// Due at once; unless it is queued within a second already: a key found locked by another holder
			// is looked at again soon (settle), and must not be retried in a tight loop while that rebuild runs.
			k.schedule(h)
		}
	default:
		k.setPersistent(h, false)
		exp := now.Add(pttl)
		if h.expiry.IsZero() || absDur(exp.Sub(h.expiry)) > expiryTolerance || h.idx < 0 {
			// New information (a newly hot key, or one an app rewrote): a new value, so a new expiry to count.
			k.judgeReading(h, now, pttl, "rebuilt by another writer after it expired")
			h.shortNotice = pttl < k.lead(h)
			h.counted, h.invalidated = false, false
			if h.expiry.IsZero() || absDur(exp.Sub(h.expiry)) > expiryTolerance {
				h.learnedAt = now // another value: first seen now
			}
			h.expiry = exp
			k.schedule(h)
		}
	}
}

// judgeReplaced judges the last reading of a value the daemon knew, taken at now: the TTL a publish reported
// for the value it replaced, or a PTTL read after the key left the hot set. Gone (pttlGone), the value was lost
// (noteGone); present, it is judged as a reading (judgeReading: someone's rebuild after the known expiry is a
// miss). Other TTLs (no expiry) judge nothing.
func (k *loopState) judgeReplaced(h *hotState, now time.Time, pttl time.Duration) {
	switch {
	case pttl == pttlGone:
		k.noteGone(h, now)
	case pttl > 0:
		k.judgeReading(h, now, pttl, "rebuilt by another writer after it expired")
	}
}

// judgeReading judges a reading, taken at now, that found h present with pttl left (a PTTL reading, the
// re-check under the lock, or the TTL a publish reported for the value it replaced) against the expiry the
// daemon knew. When that expiry had passed (by more than expiryTolerance), the value it knew has expired and the
// one found is someone else's rebuild: an SLO miss, counted once, however short the gap was. A value that can be
// shown to have been written before the known expiry (its TTL left, taken as written with at least the keyspace's
// ttl, places its write before that expiry) is an early rewrite the daemon had not learnt of, not a miss.
func (k *loopState) judgeReading(h *hotState, now time.Time, pttl time.Duration, why string) {
	k.judgeRebuild(h, now, pttl, why, false)
}

// judgeAnnounced judges a reading, taken at now, that found a new value of h after Redis announced the known
// value expired: judgeReading, without the expiry's tolerance (the announcement settles what the reading alone
// cannot).
func (k *loopState) judgeAnnounced(h *hotState, now time.Time, pttl time.Duration) {
	k.judgeRebuild(h, now, pttl, "rebuilt by another writer after it expired (announced)", true)
}

// judgeRebuild is judgeReading; announced drops the expiry's tolerance (judgeAnnounced).
func (k *loopState) judgeRebuild(h *hotState, now time.Time, pttl time.Duration, why string, announced bool) {
	if h.expiry.IsZero() || h.counted || h.missing || h.invalidated || pttl <= 0 {
		return
	}
	if !announced && now.Before(h.expiry.Add(expiryTolerance)) {
		// The value the daemon knew may still have been there.
		if !now.Before(h.expiry) {
			k.notCounted(h, now, "a new value read within the expiry's tolerance", "pttl", pttl)
			h.doubted = h.expiry // an expired event heard soon after settles it (doubtResolved)
		}
		return
	}
	if k.w.fleet != nil && k.w.fleet.stale(now) {
		// This replica stalled past its heartbeat (a SIGSTOP, a frozen VM): the others owned its keys meanwhile
		// and refreshed them, so the expiry it knew is stale. Its next heartbeat re-learns every key (setView).
		k.notCounted(h, now, "this replica's heartbeat lapsed: the others owned the key", "pttl", pttl)
		return
	}
	if latestWrite := now.Add(pttl - k.cfg.TTL); latestWrite.Before(h.expiry.Add(-expiryTolerance)) {
		// Written before the known expiry: an early rewrite, not a rebuild after a miss.
		k.notCounted(h, now, "rewritten before its known expiry (its TTL left says so)", "pttl", pttl)
		return
	}
	k.countMiss(h, now, why)
}

// doubtWindow is how long after a doubted expiry (hotState.doubted) an expired keyevent is taken as that
// value's: Redis announces an expiry when it expires the key (at once when it is read, within its active-expiry
// cycle otherwise) and the event reaches the daemon milliseconds later, or after a stall of Redis, at its end.
const doubtWindow = 5 * time.Second

// doubtResolved handles an expired keyevent for h heard at now: when h's value was last replaced, uncounted, by a
// new value read within expiryTolerance of its expiry (doubted), and the new value is far from its own expiry, the
// event can only be the replaced value's: it expired unrewritten, and the new value is a rebuild after a miss.
// The miss is counted for the doubted expiry, and the new value stays uncounted. Seed 7204: track:2455 and
// album:123, rebuilt 104–161 ms after their known expiries as a 8.4 s Redis SIGSTOP ended, read before Redis's
// announcement reached their owner, counted by nobody. It reports whether it counted.
func (k *loopState) doubtResolved(h *hotState, now time.Time) bool {
	d := h.doubted
	if d.IsZero() || now.Before(d.Add(-expiryTolerance)) || now.After(d.Add(doubtWindow)) ||
		h.expiry.IsZero() || h.expiry.Sub(now) <= expiryTolerance || h.counted || h.missing || h.invalidated {
		return false
	}
	h.doubted = time.Time{}
	cur := h.expiry
	h.expiry = d
	k.countMiss(h, now, "rebuilt by another writer after it expired (announced after the reading)")
	h.expiry, h.counted = cur, false // the count was the replaced value's; the new value's own loss counts again
	return true
}

// notCounted logs, at debug level, a reading of h taken at now after its known expiry that is not counted as a
// miss, and why: the soak's per-key check names the gaps no daemon logged, and these lines say what the owner
// made of them.
func (k *loopState) notCounted(h *hotState, now time.Time, why string, args ...any) {
	k.log.Debug("hot key past its known expiry, not counted: "+why,
		append([]any{"id", h.id, "expiry", h.expiry, "since_expiry", now.Sub(h.expiry)}, args...)...)
}

// noteGone judges a hot key found missing: an SLO miss (countMiss) unless the daemon never knew it
// present (zero expiry), the origin has no row for it, or it was invalidated (a del event: an app's or the
// change stream's invalidation, the only exclusions of the SLO). Each expiry counts once.
func (k *loopState) noteGone(h *hotState, now time.Time) {
	if h.invalidated && !h.expiry.IsZero() && !h.counted {
		k.notCounted(h, now, "gone, invalidated (a del event or a lock taken with the value)")
	}
	if h.counted || h.missing || h.invalidated || h.expiry.IsZero() {
		return
	}
	why := "expired before its refresh"
	if now.Before(h.expiry.Add(-expiryTolerance)) {
		why = "gone before its expiry (evicted, flushed or lost)"
		k.w.m.vanished.WithLabelValues(k.cfg.Name).Inc()
		k.noteVanished(now)
	}
	k.countMiss(h, now, why)
}

// countMiss counts one SLO miss of h (keepwarm_warmer_hot_expired_total): a hot key that was absent while
// hot, for whatever reason and whoever rebuilt it afterwards (see docs/operations.md, "The SLO"). It marks the
// current expiry counted, so each expiry counts once; a new value (a new expiry learnt) re-arms it. When the daemon
// learnt of the expiry less than one lead before it (shortNotice), the miss is also counted under
// keepwarm_warmer_hot_late_notice_total, a breakdown, not an exemption. In a fleet the count waits for the miss's
// fleet-wide claim, so that one miss counts in one replica (missclaim.go).
func (k *keyspace) countMiss(h *hotState, now time.Time, why string) {
	h.counted, h.missedAt, h.missedExpiry = true, now, h.expiry
	// seen is when the miss is counted, not the reading's now: a reading is dated when it was sent, and one sent
	// before a Redis stall is answered after it. A claim dated before the stall would not match the same miss
	// counted by another replica after it.
	m := miss{k: k, id: h.id, why: why, expiry: h.expiry, learnedAt: h.learnedAt, seen: k.w.now(),
		shortNotice: h.shortNotice, errors: h.errors, after: h.missSeen}
	h.missSeen = m.seen
	if !h.expiry.IsZero() {
		m.since = now.Sub(h.expiry)
	}
	if k.w.fleet != nil && k.w.fleet.submit(m) {
		return // counted once the fleet-wide claim is won (missclaim.go)
	}
	m.record("")
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
