package warmer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/keepwarm/keepwarm/lockstep"
)

// retryBase is the first back-off after a failed or skipped refresh; it doubles per consecutive failure.
const retryBase = 500 * time.Millisecond

// releaseTimeout bounds the lock release that ends every batch, even after shutdown cancelled the batch.
const releaseTimeout = 2 * time.Second

// item is one key of a refresh batch.
type item struct {
	h     *hotState
	ks    lockstep.KeySet
	pttl  time.Duration // TTL left when checked under the lock
	owned bool          // this batch holds the key's lock
	lost  bool          // a lease extension found the lock lost
}

// refresh runs one batch of due keys through the pipeline: wait for origin budget; acquire the locks
// (pipelined); skip keys whose lock is held elsewhere; re-check PTTL under the lock so a key someone else just
// rebuilt is not rebuilt again; one origin query for the rest, extending the leases while it runs; publish with
// the token-checked script (pipelined) and jittered TTLs; apply the missing policy; on origin failure keep the
// current values alive (fail-safe). Every lock the batch holds is released before it returns.
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
			k.finish(h, func() { h.lastErr = err.Error() })
			continue
		}
		items = append(items, &item{h: h, ks: ks})
	}
	token := lockstep.NewToken()
	defer k.releaseOwned(ctx, items, token)

	if err := k.limiter.Wait(ctx); err != nil {
		k.requeue(items, retryBase, "")
		return
	}
	if err := k.acquire(ctx, cfg, items, token); err != nil {
		k.redisError(ctx, "acquire locks", err)
		k.requeue(items, retryBase, err.Error())
		return
	}
	toFetch := k.recheck(cfg, items)
	if len(toFetch) > 0 {
		k.fetchAndPublish(ctx, cfg, toFetch, token)
	}
	k.w.m.refreshSeconds.WithLabelValues(cfg.Name).Observe(time.Since(start).Seconds())
}

// acquire takes the locks of items, pipelined, and re-checks their TTL in a second pipelined round trip. Keys
// locked elsewhere are re-queued.
func (k *keyspace) acquire(ctx context.Context, cfg KeyspaceConfig, items []*item, token string) error {
	locks := make([]string, len(items))
	for i, it := range items {
		locks[i] = it.ks.Lock
	}
	ok, err := lockstep.AcquireMany(ctx, k.w.rdb, locks, token, cfg.LockTTL)
	if err != nil {
		return err
	}
	var owned []*item
	held := 0
	for i, it := range items {
		if ok[i] {
			it.owned = true
			owned = append(owned, it)
			continue
		}
		held++
		k.count(ResultLocked)
		// An app or another replica is rebuilding it: look again soon, by which time the new value is there.
		k.finish(it.h, func() {
			it.h.needPTTL = true
			k.q.schedule(it.h, k.w.now().Add(min(cfg.LockTTL/2, time.Second)))
		})
	}
	k.w.m.locks.WithLabelValues(cfg.Name, "acquired").Add(float64(len(owned)))
	k.w.m.locks.WithLabelValues(cfg.Name, "held").Add(float64(held))
	if len(owned) == 0 {
		return nil
	}
	ids := make([]string, len(owned))
	for i, it := range owned {
		ids[i] = it.h.id
	}
	ttls, err := k.pttls(ctx, cfg.Keys, ids)
	if err != nil {
		return err
	}
	for i, it := range owned {
		it.pttl = ttls[i]
	}
	return nil
}

// recheck decides, under the locks, which owned keys really need the origin: a key that someone else refreshed
// since the daemon last looked is only rescheduled ("fresh"), a key without TTL is reported and left alone.
func (k *keyspace) recheck(cfg KeyspaceConfig, items []*item) []*item {
	now := k.w.now()
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []*item
	for _, it := range items {
		if !it.owned {
			continue
		}
		h := it.h
		est := h.rebuildP95
		if est == 0 {
			est = k.p95.p95()
		}
		ld := lead(cfg.RefreshAhead, cfg.LeadMultiple, est)
		switch {
		case h.e.hot != h:
			// No longer hot since the batch was formed: leave it to expire.
			h.inflight = false
		case it.pttl == pttlPersistent:
			h.inflight = false
			k.applyPTTLLocked(h, it.pttl, now, false)
		case it.pttl > ld+ld/2 && !h.absent:
			// Someone else refreshed it since we last looked: do not rebuild it twice within one TTL.
			h.inflight = false
			h.needPTTL = false
			k.count(ResultFresh)
			h.expiry = now.Add(it.pttl)
			k.scheduleLocked(h)
		default:
			if it.pttl < 0 {
				k.noteGoneLocked(h, now)
			}
			out = append(out, it)
		}
	}
	return out
}

// fetchAndPublish runs one origin query for items and publishes the results.
func (k *keyspace) fetchAndPublish(ctx context.Context, cfg KeyspaceConfig, items []*item, token string) {
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.h.id
	}
	// The query may run up to the statement timeout plus a margin; the leases are extended while it runs, and
	// never past that bound.
	bound := cfg.StatementTimeout + cfg.LockTTL/3
	qctx, cancel := context.WithTimeout(ctx, bound)
	stopLease := k.extendLeases(qctx, cfg, items, token)
	qstart := time.Now()
	values, missing, err := cfg.Src.Fetch(qctx, ids)
	rebuild := time.Since(qstart)
	cancel()
	stopLease()
	k.w.m.originSeconds.WithLabelValues(cfg.Name).Observe(rebuild.Seconds())
	if err != nil && ctx.Err() != nil {
		// Shutdown past the grace period cancelled the query: not an origin failure.
		k.requeue(items, retryBase, "")
		return
	}
	if err != nil {
		k.w.m.originQueries.WithLabelValues(cfg.Name, "error").Inc()
		k.failSafe(ctx, cfg, items, token, err)
		return
	}
	k.w.m.originQueries.WithLabelValues(cfg.Name, "ok").Inc()
	k.w.m.originRows.WithLabelValues(cfg.Name).Add(float64(len(values)))
	k.originOK()
	isMissing := make(map[string]bool, len(missing))
	for _, id := range missing {
		isMissing[id] = true
	}

	var writes []lockstep.Write
	var witems []*item
	var keep []*item
	k.mu.Lock()
	for _, it := range items {
		if it.lost {
			continue
		}
		v, found := values[it.h.id]
		switch {
		case found && cfg.MaxValueBytes > 0 && len(v) > cfg.MaxValueBytes:
			err := fmt.Errorf("value of %d bytes exceeds max_value_bytes %d", len(v), cfg.MaxValueBytes)
			k.log.Warn("refusing value", "id", it.h.id, "error", err)
			it.h.lastErr = err.Error()
			keep = append(keep, it)
		case found:
			writes = append(writes, lockstep.Write{Keys: it.ks, Token: token, Value: v,
				TTL: lockstep.Jitter(cfg.TTL, cfg.Jitter, k.rnd.Float64()), StaleTTL: cfg.StaleTTL, Rebuild: rebuild})
			witems = append(witems, it)
		case isMissing[it.h.id] || !found:
			switch cfg.Missing {
			case MissingDelete:
				writes = append(writes, lockstep.Write{Keys: it.ks, Token: token, Delete: true, TTL: cfg.TTL})
				witems = append(witems, it)
			case MissingTombstone:
				writes = append(writes, lockstep.Write{Keys: it.ks, Token: token, Value: cfg.Tombstone,
					TTL: cfg.TombstoneTTL, Rebuild: rebuild})
				witems = append(witems, it)
			default: // keep: leave the value to its TTL
				keep = append(keep, it)
			}
		}
	}
	k.mu.Unlock()

	pubStart := k.w.now()
	var results []error
	if len(writes) > 0 {
		results, err = lockstep.PublishMany(ctx, k.w.rdb, writes)
		if err != nil {
			k.redisError(ctx, "publish", err)
			k.requeue(witems, retryBase, err.Error())
			k.requeue(keep, retryBase, "")
			return
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, it := range items {
		if it.lost {
			k.count(ResultLockLost)
			it.h.inflight = false
			k.retryLocked(it.h, retryBase)
		}
	}
	for _, it := range keep {
		h := it.h
		h.inflight = false
		if h.lastErr != "" {
			k.count(ResultError)
			h.errors++
			k.retryLocked(h, retryBase)
			continue
		}
		k.count(ResultMissing)
		h.absent = true
		k.q.schedule(h, pubStart.Add(cfg.TTL))
	}
	for i, it := range witems {
		h := it.h
		w := writes[i]
		h.inflight = false
		it.owned = false // the publish script deleted the lock, or it was not ours any more
		if results[i] != nil {
			k.count(ResultLockLost)
			h.lastErr = results[i].Error()
			k.retryLocked(h, retryBase)
			continue
		}
		h.lastRefresh = pubStart
		h.lastErr = ""
		h.errors = 0
		h.staleSince = time.Time{}
		h.counted = false
		h.needPTTL = false
		if w.Delete {
			k.count(ResultMissing)
			h.absent = true
			h.expiry = time.Time{}
			k.q.schedule(h, pubStart.Add(cfg.TTL))
			continue
		}
		if isMissing[h.id] {
			k.count(ResultMissing)
		} else {
			k.count(ResultOK)
			h.observeRebuild(rebuild)
			k.p95.add(rebuild)
		}
		h.absent = isMissing[h.id]
		k.w.m.leadSeconds.WithLabelValues(cfg.Name).Observe(max(it.pttl, 0).Seconds())
		h.expiry = pubStart.Add(w.TTL)
		k.scheduleLocked(h)
	}
}

// extendLeases extends the batch's locks every LockTTL/3 while the origin query runs, until ctx (bounded by the
// statement timeout plus a margin) ends or the returned stop is called. A key whose extension fails has lost
// its lock; its result is dropped (the publish script would refuse it anyway).
func (k *keyspace) extendLeases(ctx context.Context, cfg KeyspaceConfig, items []*item, token string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(cfg.LockTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			var live []*item
			k.mu.Lock()
			for _, it := range items {
				if !it.lost {
					live = append(live, it)
				}
			}
			k.mu.Unlock()
			locks := make([]string, len(live))
			for i, it := range live {
				locks[i] = it.ks.Lock
			}
			ok, err := lockstep.ExtendMany(ctx, k.w.rdb, locks, token, cfg.LockTTL)
			if err != nil {
				continue // Redis trouble: the publish's token check still guards correctness
			}
			k.mu.Lock()
			for i, it := range live {
				if ok[i] {
					k.w.m.leaseExtends.WithLabelValues(cfg.Name, "ok").Inc()
					continue
				}
				it.lost = true
				it.owned = false
				k.w.m.leaseExtends.WithLabelValues(cfg.Name, "lost").Inc()
			}
			k.mu.Unlock()
		}
	}()
	return func() {
		close(done)
		wg.Wait()
	}
}

// failSafe keeps hot values alive while the origin fails: rather than let them expire into a stampede against
// a sick database, it extends each current value's TTL under the lock until the next retry, bounded so that no
// value outlives its last good expiry by more than max_stale. It logs once per outage, not once per key.
func (k *keyspace) failSafe(ctx context.Context, cfg KeyspaceConfig, items []*item, token string, cause error) {
	now := k.w.now()
	k.mu.Lock()
	if !k.outage {
		k.outage = true
		k.log.Error("origin failing; serving current values past their TTL (fail-safe)", "max_stale", cfg.MaxStale,
			"error", cause)
	}
	var ext []*item
	var extTTL []time.Duration
	for _, it := range items {
		h := it.h
		h.errors++
		h.lastErr = cause.Error()
		k.count(ResultError)
		if it.lost || it.pttl <= 0 {
			continue
		}
		if h.staleSince.IsZero() {
			h.staleSince = now.Add(it.pttl) // the value's own expiry: staleness starts there
		}
		retry := min(retryBase<<min(h.errors, 6), max(cfg.TTL/2, time.Second))
		want := retry + lead(cfg.RefreshAhead, cfg.LeadMultiple, h.rebuildP95)
		limit := h.staleSince.Add(cfg.MaxStale).Sub(now)
		if want > limit {
			want = limit
		}
		if want <= it.pttl {
			continue // never shorten a TTL; past max_stale the value is left to expire
		}
		ext = append(ext, it)
		extTTL = append(extTTL, want)
	}
	k.mu.Unlock()

	// Extend in groups of equal TTL (usually one group).
	extended := map[*item]bool{}
	byTTL := map[time.Duration][]*item{}
	for i, it := range ext {
		byTTL[extTTL[i]] = append(byTTL[extTTL[i]], it)
	}
	for ttl, group := range byTTL {
		sets := make([]lockstep.KeySet, len(group))
		for i, it := range group {
			sets[i] = it.ks
		}
		res, err := lockstep.ExtendValueMany(ctx, k.w.rdb, sets, token, ttl)
		if err != nil {
			k.redisError(ctx, "fail-safe extend", err)
			continue
		}
		for i, it := range group {
			if res[i] == nil {
				extended[it] = true
				it.owned = false // the script released the lock
				k.w.m.failSafe.WithLabelValues(cfg.Name).Inc()
			} else if errors.Is(res[i], lockstep.ErrLockLost) {
				it.owned = false
			}
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, it := range items {
		h := it.h
		h.inflight = false
		if extended[it] {
			for i, e := range ext {
				if e == it {
					h.expiry = now.Add(extTTL[i])
				}
			}
		}
		k.retryLocked(h, retryBase)
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

// finish runs f on h's state under the keyspace lock and marks h no longer in flight.
func (k *keyspace) finish(h *hotState, f func()) {
	k.mu.Lock()
	defer k.mu.Unlock()
	h.inflight = false
	f()
}

// requeue puts items back for a retry after a failure that was not the origin's (Redis, shutdown).
func (k *keyspace) requeue(items []*item, base time.Duration, errText string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, it := range items {
		it.h.inflight = false
		if errText != "" {
			it.h.lastErr = errText
			it.h.errors++
			k.count(ResultError)
		}
		k.retryLocked(it.h, base)
	}
}

// releaseOwned releases every lock the batch still holds. It runs even when ctx was cancelled (shutdown past
// the grace period), with its own short deadline, so that apps never wait out lock_ttl because of the daemon.
func (k *keyspace) releaseOwned(ctx context.Context, items []*item, token string) {
	var locks []string
	k.mu.Lock()
	for _, it := range items {
		if it.owned {
			locks = append(locks, it.ks.Lock)
			it.owned = false
		}
		it.h.inflight = false
	}
	k.mu.Unlock()
	if len(locks) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if err := lockstep.ReleaseMany(rctx, k.w.rdb, locks, token); err != nil {
		k.log.Warn("release locks", "count", len(locks), "error", err)
	}
}
