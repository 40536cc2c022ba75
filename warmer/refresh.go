package warmer

import (
	"context"
	"errors"
	"time"

	"github.com/keepwarm/keepwarm/lockstep"
)

// retryBase is the first back-off after a failed or skipped refresh; it doubles per consecutive failure.
const retryBase = 500 * time.Millisecond

// resultSettled marks an item the re-check under the lock already dealt with (no longer hot, or no TTL): it is
// not a refresh and is not counted.
const resultSettled = "settled"

// refresh runs one batch of due hot keys through the pipeline (see pipeline) with the daemon's two additions:
// under the locks it re-reads PTTL so a key someone else just rebuilt is not rebuilt again, and on origin
// failure it keeps the current values alive (fail-safe). Then it reschedules every key.
func (k *keyspace) refresh(ctx context.Context, batch []*hotState) {
	k.mu.Lock()
	cfg := k.cfg
	k.mu.Unlock()
	start := time.Now()
	items := make([]*item, 0, len(batch))
	for _, h := range batch {
		ks, err := cfg.Keys.For(h.id)
		if err != nil { // cannot happen for ids that passed ValidateID; drop the key rather than loop on it
			k.log.Warn("dropping hot id with no valid key", "id", h.id, "error", err)
			k.mu.Lock()
			h.inflight, h.lastErr = false, err.Error()
			k.mu.Unlock()
			continue
		}
		items = append(items, &item{id: h.id, ks: ks, h: h})
	}
	var p *pipeline
	p = &pipeline{k: k, cfg: cfg,
		ttl:      func() time.Duration { return lockstep.Jitter(cfg.TTL, cfg.Jitter, k.rnd.Float64()) },
		recheck:  k.recheck,
		failSafe: func(ctx context.Context, items []*item, cause error) { k.failSafe(ctx, p.cfg, p.token, items, cause) },
	}
	err := p.run(ctx, items)
	if err != nil && ctx.Err() == nil && !errors.Is(err, context.Canceled) {
		k.redisError(ctx, "refresh", err)
	}
	k.settle(p, items, err)
	k.w.m.refreshSeconds.WithLabelValues(cfg.Name).Observe(time.Since(start).Seconds())
}

// settle records each item's result in its hot state and reschedules it.
func (k *keyspace) settle(p *pipeline, items []*item, runErr error) {
	cfg := p.cfg
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, it := range items {
		h := it.h
		h.inflight = false
		if runErr != nil && it.result == "" {
			// The batch could not run (Redis failed, or shutdown): try again after a back-off.
			if ctxErr := errors.Is(runErr, context.Canceled) || errors.Is(runErr, context.DeadlineExceeded); !ctxErr {
				h.lastErr = runErr.Error()
				h.errors++
				k.count(ResultError)
			}
			k.retryLocked(h, retryBase)
			continue
		}
		if it.result != "" && it.result != ResultFresh && it.result != resultSettled {
			k.count(it.result)
		}
		switch it.result {
		case ResultLocked:
			// An app or another replica is rebuilding it: look again soon, by which time the new value is there.
			h.needPTTL = true
			k.q.schedule(h, k.w.now().Add(min(cfg.LockTTL/2, time.Second)))
		case ResultLockLost:
			if it.err != nil {
				h.lastErr = it.err.Error()
			}
			k.retryLocked(h, retryBase)
		case ResultError:
			if it.err != nil {
				h.lastErr = it.err.Error()
			}
			if !it.rescheduled { // the fail-safe reschedules the keys it handled
				h.errors++
				k.retryLocked(h, retryBase)
			}
		case ResultMissing:
			h.absent = true
			h.lastErr = ""
			h.lastRefresh = p.start
			if it.delete || cfg.Missing == MissingKeep {
				h.expiry = time.Time{}
				k.q.schedule(h, k.w.now().Add(cfg.TTL)) // look again in one TTL, not at once
				continue
			}
			h.expiry = p.start.Add(it.ttl) // tombstone
			k.scheduleLocked(h)
		case ResultOK:
			h.lastRefresh = p.start
			h.lastErr = ""
			h.errors = 0
			h.staleSince = time.Time{}
			h.counted = false
			h.shortNotice = false
			h.needPTTL = false
			h.absent = false
			h.observeRebuild(p.rebuild)
			k.p95.add(p.rebuild)
			k.w.m.leadSeconds.WithLabelValues(cfg.Name).Observe(max(it.pttl, 0).Seconds())
			h.expiry = p.start.Add(it.ttl)
			k.scheduleLocked(h)
		}
	}
}

// recheck decides, under the locks, which owned keys really need the origin: a key that someone else refreshed
// since the daemon last looked is only rescheduled ("fresh"), a key without TTL is reported and left alone, and
// a key no longer hot is dropped. It reads the PTTLs in one pipelined round trip.
func (k *keyspace) recheck(ctx context.Context, items []*item) ([]*item, error) {
	k.mu.Lock()
	cfg := k.cfg
	k.mu.Unlock()
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.id
	}
	ttls, err := k.pttls(ctx, cfg.Keys, ids)
	if err != nil {
		return nil, err
	}
	now := k.w.now()
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []*item
	for i, it := range items {
		it.pttl = ttls[i]
		h := it.h
		est := h.rebuildP95
		if est == 0 {
			est = k.p95.p95()
		}
		ld := lead(cfg.RefreshAhead, cfg.LeadMultiple, est)
		switch {
		case h.e.hot != h:
			it.result = resultSettled // no longer hot since the batch was formed: leave it to expire
		case it.pttl == pttlPersistent:
			it.result = resultSettled
			k.applyPTTLLocked(h, it.pttl, now, false)
		case it.pttl > ld+ld/2 && !h.absent:
			// Someone else refreshed it since we last looked: do not rebuild it twice within one TTL.
			it.result = ResultFresh
			k.count(ResultFresh)
			h.needPTTL = false
			h.shortNotice = false
			h.expiry = now.Add(it.pttl)
			k.scheduleLocked(h)
		default:
			if it.pttl < 0 {
				k.noteGoneLocked(h, now)
			}
			out = append(out, it)
		}
	}
	return out, nil
}

// failSafe keeps hot values alive while the origin fails: rather than let them expire into a stampede against
// a sick database, it extends each current value's TTL under the lock until the next retry, bounded so that no
// value outlives its last good expiry by more than max_stale. It logs once per outage, not once per key.
func (k *keyspace) failSafe(ctx context.Context, cfg KeyspaceConfig, token string, items []*item, cause error) {
	now := k.w.now()
	k.mu.Lock()
	if !k.outage {
		k.outage = true
		k.log.Error("origin failing; serving current values past their TTL (fail-safe)", "max_stale", cfg.MaxStale,
			"error", cause)
	}
	byTTL := map[time.Duration][]*item{}
	for _, it := range items {
		h := it.h
		it.result, it.err = ResultError, cause
		h.errors++
		if it.lost || it.pttl <= 0 {
			continue
		}
		if h.staleSince.IsZero() {
			h.staleSince = now.Add(it.pttl) // the value's own expiry: staleness starts there
		}
		retry := min(retryBase<<min(h.errors, 6), max(cfg.TTL/2, time.Second))
		want := retry + lead(cfg.RefreshAhead, cfg.LeadMultiple, h.rebuildP95)
		if limit := h.staleSince.Add(cfg.MaxStale).Sub(now); want > limit {
			want = limit
		}
		if want <= it.pttl {
			continue // never shorten a TTL; past max_stale the value is left to expire
		}
		byTTL[want] = append(byTTL[want], it)
	}
	k.mu.Unlock()

	extended := map[*item]time.Duration{}
	for ttl, group := range byTTL { // usually one group
		sets := make([]lockstep.KeySet, len(group))
		for i, it := range group {
			sets[i] = it.ks
		}
		res, err := lockstep.ExtendValueMany(ctx, k.w.rdb, sets, token, ttl)
		if err != nil {
			k.redisError(ctx, "fail-safe extend", err)
			continue
		}
		k.mu.Lock()
		for i, it := range group {
			if res[i] == nil {
				extended[it] = ttl
				k.w.m.failSafe.WithLabelValues(cfg.Name).Inc()
			}
			if res[i] == nil || errors.Is(res[i], lockstep.ErrLockLost) {
				it.owned = false // the script released the lock, or it was not ours any more
			}
		}
		k.mu.Unlock()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, it := range items {
		if ttl, ok := extended[it]; ok {
			it.h.expiry = now.Add(ttl)
		}
		it.rescheduled = true
		k.retryLocked(it.h, retryBase)
	}
}

func (k *keyspace) originOK() {
	k.mu.Lock()
	was := k.outage
	k.outage = false
	k.mu.Unlock()
	if was {
		k.log.Info("origin recovered; refreshes resumed")
	}
}
