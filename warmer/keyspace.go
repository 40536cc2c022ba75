package warmer

import (
	"context"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/keepwarm/keepwarm/internal/backoff"
)

// keyspace is the state and scheduler loop of one keyspace. mu guards everything below it.
type keyspace struct {
	name    string   // immutable: a keyspace renamed by a reload is a new keyspace
	match   *matcher // cache key → id, for notifications and the LFU scan; nil when the template has not exactly one ${id}
	w       *Warmer
	log     *slog.Logger
	limiter *rate.Limiter
	wake    chan struct{}
	batches sync.WaitGroup // in-flight refresh batches

	cancelMu sync.Mutex
	cancel   context.CancelFunc

	results    map[string]*atomic.Int64 // refreshes by result, for Status (the metrics hold the same counts)
	hotExpired atomic.Int64             // the SLO counter, for Status

	mu             sync.Mutex
	cfg            KeyspaceConfig
	tr             *tracker
	hotSet         map[string]*hotState
	q              dueQueue
	adopt          []*hotState // hot keys whose expiry must be learnt with PTTL
	running        int         // origin queries in flight
	rnd            *rand.Rand
	origin         outage // the origin's failures, logged once per outage
	originFailures int    // origin queries failed in a row (see originFailed)
	redis          outage // Redis's failures, logged once per outage
	lastSync       time.Time
	lfu            lfuState
	invalid        invalidIDs // skipped ids not yet reported in the log
	p95            rebuildWindow
	waste          wasteRatio // the refresh feedback's wasted share (selection.go)
}

func (w *Warmer) newKeyspace(c KeyspaceConfig) *keyspace {
	k := &keyspace{
		name:    c.Name,
		match:   newMatcher(c.Keys.Cache.String()), // the layout never changes for one keyspace (see sameLayout)
		w:       w,
		log:     w.log.With("keyspace", c.Name),
		limiter: rate.NewLimiter(limit(c.OriginRate), burst(c.OriginRate)),
		wake:    make(chan struct{}, 1),
		cfg:     c,
		tr:      newTracker(c.MaxTracked, c.DecayHalfLife),
		hotSet:  make(map[string]*hotState),
		rnd:     w.newRand(),
		results: map[string]*atomic.Int64{},
	}
	for _, r := range []string{ResultOK, ResultFresh, ResultLocked, ResultMissing, ResultLockLost, ResultLockGone, ResultTooLarge, ResultError} {
		k.results[r] = new(atomic.Int64)
	}
	k.tr.setPinned(c.Pinned, w.now().Unix())
	return k
}

// count records one refresh result in the metrics and in the keyspace's own counters.
func (k *keyspace) count(result string) {
	k.w.m.refreshes.WithLabelValues(k.name, result).Inc()
	k.results[result].Add(1)
}

func limit(r float64) rate.Limit {
	if r <= 0 {
		return rate.Inf
	}
	return rate.Limit(r)
}

// burst is one second's worth of queries, at least 1: enough to absorb scheduling noise, never a burst that
// "many keys fell due together" could turn into a spike against the origin.
func burst(r float64) int {
	if r <= 0 {
		return 1
	}
	return max(1, int(math.Ceil(r)))
}

func (k *keyspace) config() KeyspaceConfig {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cfg
}

// update applies a changed configuration with the same key layout, keeping the tracked state.
func (k *keyspace) update(c KeyspaceConfig) {
	k.mu.Lock()
	k.cfg = c
	k.tr.max = c.MaxTracked
	k.tr.halfLife = c.DecayHalfLife
	k.tr.setPinned(c.Pinned, k.w.now().Unix())
	// Apply pin changes now rather than at the next poll: an id pinned before a promotion is warmed at once.
	cands := make([]string, 0, len(k.hotSet))
	for id := range k.hotSet {
		cands = append(cands, id)
	}
	k.setHotLocked(k.tr.selectHot(cands, c.TopN, c.MinScore, k.w.now().Unix()))
	k.mu.Unlock()
	k.limiter.SetLimit(limit(c.OriginRate))
	k.limiter.SetBurst(burst(c.OriginRate))
	k.poke()
}

func (k *keyspace) poke() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

func (k *keyspace) start(ctx, workCtx context.Context, wg *sync.WaitGroup) {
	lctx, cancel := context.WithCancel(ctx)
	k.cancelMu.Lock()
	k.cancel = cancel
	k.cancelMu.Unlock()
	wg.Add(1)
	go func() {
		defer wg.Done()
		k.loop(lctx, workCtx)
	}()
}

func (k *keyspace) stop() {
	k.cancelMu.Lock()
	defer k.cancelMu.Unlock()
	if k.cancel != nil {
		k.cancel()
	}
}

// loop is the keyspace's scheduler: it reads the hot-key signals, learns expiries, and dispatches due keys to
// refresh batches within the origin budget, until ctx ends.
func (k *keyspace) loop(ctx, workCtx context.Context) {
	cfg := k.config()
	k.log.Info("keyspace scheduler started", "key", cfg.Keys.Cache.String(), "ttl", cfg.TTL,
		"refresh_ahead", cfg.RefreshAhead, "top_n", cfg.TopN, "pinned", len(cfg.Pinned))
	k.checkLFU(ctx)
	k.poll(ctx)
	poll := time.NewTicker(cfg.PollInterval)
	defer poll.Stop()
	reconcile := time.NewTicker(cfg.ReconcileEvery)
	defer reconcile.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		k.learnExpiries(ctx)
		wait := k.dispatch(ctx, workCtx)
		k.w.tick()
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-k.wake:
		case <-poll.C:
			k.poll(ctx)
		case <-reconcile.C:
			k.reconcile(ctx)
		}
		if c := k.config(); c.PollInterval != cfg.PollInterval || c.ReconcileEvery != cfg.ReconcileEvery {
			cfg = c
			poll.Reset(cfg.PollInterval)
			reconcile.Reset(cfg.ReconcileEvery)
		}
	}
}

// dispatch starts refresh batches for the due keys while the origin budget has room, and returns how long to
// sleep until the next key falls due.
func (k *keyspace) dispatch(ctx, workCtx context.Context) time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.w.now()
	cfg := k.cfg
	for k.running < cfg.MaxOriginConcurrency && ctx.Err() == nil {
		batch := k.q.popDue(now.Add(cfg.GatherWindow), cfg.BatchSize)
		if len(batch) == 0 {
			break
		}
		for _, h := range batch {
			h.inflight = true
		}
		k.running++
		k.batches.Add(1)
		go func() {
			defer k.batches.Done()
			k.refresh(workCtx, batch)
			k.mu.Lock()
			k.running--
			k.mu.Unlock()
			k.poke()
		}()
	}
	due := 0
	for _, h := range k.q {
		if !h.due.After(now) {
			due++
		}
	}
	k.w.m.queued.WithLabelValues(cfg.Name).Set(float64(due))
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

// setHotLocked applies a new hot set: newly hot ids are adopted (their expiry is learnt with PTTL), ids no longer hot
// leave the queue but stay tracked.
func (k *keyspace) setHotLocked(hot map[string]bool) {
	for id, h := range k.hotSet {
		if !hot[id] {
			k.q.remove(h)
			h.e.hot = nil
			h.e.leftHot()
			delete(k.hotSet, id)
		}
	}
	now := k.w.now().Unix()
	for id := range hot {
		if _, ok := k.hotSet[id]; ok {
			continue
		}
		e := k.tr.entries[id]
		if e == nil {
			e = k.tr.observe(id, 0, now)
		}
		h := &hotState{id: id, e: e, idx: -1, needPTTL: true}
		e.hot = h
		k.hotSet[id] = h
		k.adopt = append(k.adopt, h)
	}
	k.gaugesLocked()
}

// gaugesLocked updates the keyspace's gauges.
func (k *keyspace) gaugesLocked() {
	persistent := 0
	for _, h := range k.hotSet {
		if h.persistent {
			persistent++
		}
	}
	k.w.m.hot.WithLabelValues(k.cfg.Name).Set(float64(len(k.hotSet)))
	k.w.m.tracked.WithLabelValues(k.cfg.Name).Set(float64(len(k.tr.entries)))
	k.w.m.persistent.WithLabelValues(k.cfg.Name).Set(float64(persistent))
}

// scheduleLocked queues h for its next refresh given its known expiry.
func (k *keyspace) scheduleLocked(h *hotState) {
	if h.e.hot != h || h.persistent {
		return
	}
	now := k.w.now()
	if h.expiry.IsZero() {
		k.q.schedule(h, now)
		return
	}
	k.q.schedule(h, dueAt(h.expiry, k.leadLocked(h), k.rebuildEstimateLocked(h), 1-k.rnd.Float64()))
}

// rebuildEstimateLocked is h's rebuild p95, or the keyspace's for a key not rebuilt yet.
func (k *keyspace) rebuildEstimateLocked(h *hotState) time.Duration {
	if h.rebuildP95 > 0 {
		return h.rebuildP95
	}
	return k.p95.p95()
}

// leadLocked is how long before its expiry h is refreshed: the one place where the lead is computed (see
// KeyspaceConfig.Lead), used by the scheduler, the re-check under the lock, the short-notice test and the
// fail-safe alike.
func (k *keyspace) leadLocked(h *hotState) time.Duration {
	return k.cfg.Lead(k.rebuildEstimateLocked(h))
}

// retryLocked queues h for another attempt after retryDelayLocked.
func (k *keyspace) retryLocked(h *hotState, base time.Duration) {
	if h.e.hot != h {
		return
	}
	k.q.schedule(h, k.w.now().Add(k.retryDelayLocked(h, base)))
}

// retryDelayLocked is the back-off before another attempt at h (backoff.Delay, the daemon's one formula): in
// [base, 2·base) doubled per consecutive error of h, capped at max(TTL/2, 1s), jittered so that keys that failed
// together (and replicas) do not retry in step.
func (k *keyspace) retryDelayLocked(h *hotState, base time.Duration) time.Duration {
	return backoff.Delay(h.errors+1, base, max(k.cfg.TTL/2, time.Second), k.rnd.Float64())
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
