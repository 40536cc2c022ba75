package warmer

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/redis/go-redis/v9"
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
func (k *keyspace) learnExpiries(ctx context.Context) {
	k.mu.Lock()
	var hs []*hotState
	for _, h := range k.adopt {
		if h.e.hot == h && h.needPTTL && !h.inflight && k.ownsLocked(h.id) {
			hs = append(hs, h)
		}
	}
	k.adopt = k.adopt[:0]
	k.mu.Unlock()
	// Keys of an expired, evicted or del event (onEvent) are read like a reconciliation, so that a key really
	// gone counts as expired or vanished, and a key that MIGRATE moved to another node, or that a stale node
	// reported, counts as nothing.
	var deleted []*hotState
	hs = slices.DeleteFunc(hs, func(h *hotState) bool {
		if h.goneEvent != "" {
			deleted = append(deleted, h)
			return true
		}
		return false
	})
	for _, batch := range []struct {
		hs          []*hotState
		reconciling bool
	}{{hs, false}, {deleted, true}} {
		if !k.readPTTLs(ctx, batch.hs, "read PTTL of new hot keys", batch.reconciling) {
			k.mu.Lock()
			k.adopt = append(k.adopt, batch.hs...) // try again on the next pass
			k.mu.Unlock()
		}
	}
}

// readPTTLs reads the PTTL of hs (pipelined) and folds each reading into its key's state and schedule, skipping
// keys that stopped being hot or went in flight meanwhile. It reports false when Redis failed (logged once per
// outage as what).
func (k *keyspace) readPTTLs(ctx context.Context, hs []*hotState, what string, reconciling bool) bool {
	if len(hs) == 0 {
		return true
	}
	ids := make([]string, len(hs))
	for i, h := range hs {
		ids[i] = h.id
	}
	k.mu.Lock()
	keys := k.cfg.Keys
	writes := make([]uint32, len(hs)) // a reading taken before a write that settled meanwhile is stale: dropped
	for i, h := range hs {
		writes[i] = h.writes
	}
	k.mu.Unlock()
	now := k.w.now()
	epoch := k.w.trust.epoch.Load() // a reading confirms an own write only if no notification was missed since
	ttls, err := k.pttls(ctx, keys, ids)
	if err != nil {
		k.redisError(ctx, what, err)
		return false
	}
	k.redisOK()
	k.mu.Lock()
	defer k.mu.Unlock()
	for i, h := range hs {
		if h.e.hot != h || h.inflight || h.writes != writes[i] {
			if h.e.hot == h && h.cidx < 0 {
				k.scheduleCheckLocked(h, now) // its refresh settles it; keep it in the check queue meanwhile
			}
			continue
		}
		if h.goneEvent == "expired" && ttls[i] == pttlGone && !h.expiry.IsZero() {
			h.expiry = minTime(h.expiry, now) // Redis expired it: an SLO miss even if the estimate was later
		}
		h.needPTTL, h.goneEvent = false, ""
		handover := k.noteHandoverLocked(h, ttls[i], now)
		k.applyPTTLLocked(h, ttls[i], now, reconciling)
		if handover {
			h.shortNotice = false // the fleet had the notice: its previous owner did
		}
		prev := h.expiry
		k.applyPTTLLocked(h, ttls[i], now, reconciling)
		if h.ownWrite && ttls[i] > 0 && absDur(h.expiry.Sub(prev)) <= expiryTolerance {
			h.notifyEpoch = epoch // the daemon's own value, confirmed: trusted again while notifications stay healthy
		} else {
			h.ownWrite = false
		}
		k.scheduleCheckLocked(h, now)
	}
	return true
}

// applyPTTLLocked folds a PTTL reading taken at now into h's state and schedule. reconciling marks a reading of
// a key the daemon was already watching, where "gone" may be an SLO miss.
func (k *keyspace) applyPTTLLocked(h *hotState, pttl time.Duration, now time.Time, reconciling bool) {
	switch {
	case pttl == pttlPersistent:
		if !h.persistent {
			k.log.Warn("hot key has no TTL; keepwarm will not overwrite it", "id", h.id)
		}
		h.persistent = true
		k.q.remove(h)
		k.gaugesLocked()
	case pttl < 0: // gone
		h.persistent = false
		if reconciling {
			k.noteGoneLocked(h, now)
		}
		h.expiry = time.Time{}
		k.scheduleLocked(h)
	default:
		h.persistent = false
		exp := now.Add(pttl)
		if h.expiry.IsZero() || absDur(exp.Sub(h.expiry)) > expiryTolerance || h.idx < 0 {
			// New information (a newly hot key, or one an app rewrote): was there still time to refresh it?
			h.shortNotice = pttl < k.leadLocked(h)
			h.expiry = exp
			k.scheduleLocked(h)
		}
	}
}

// noteGoneLocked counts a hot key found missing: an SLO miss if its expiry had passed without a refresh, else a
// key deleted or evicted early. Each expiry counts once.
func (k *keyspace) noteGoneLocked(h *hotState, now time.Time) {
	if h.counted || h.missing || h.expiry.IsZero() {
		return
	}
	h.counted = true
	if h.shortNotice {
		// The key became hot (or an app rewrote it) less than one lead before it expired: the daemon never had
		// the time to refresh it, so this is not counted against the SLO.
		k.w.m.lateNotice.WithLabelValues(k.cfg.Name).Inc()
		return
	}
	if !now.Before(h.expiry.Add(-expiryTolerance)) {
		k.w.m.hotExpired.WithLabelValues(k.cfg.Name).Inc()
		k.hotExpired.Add(1)
		k.log.Warn("hot key expired before its refresh", "id", h.id, "expired_ago", now.Sub(h.expiry))
		return
	}
	k.w.m.vanished.WithLabelValues(k.cfg.Name).Inc()
	k.noteVanishedLocked(now)
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
