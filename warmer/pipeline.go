package warmer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/keepwarm/keepwarm/lockstep"
)

// releaseTimeout bounds the lock release that ends every batch, even after shutdown cancelled the batch.
const releaseTimeout = 2 * time.Second

// item is one key in a batch of the refresh pipeline. The pipeline sets result (one of the ResultX values),
// and for written values ttl and size.
type item struct {
	id    string
	ks    lockstep.KeySet
	h     *hotState     // the daemon's state of a hot key; nil in a warmup
	pttl  time.Duration // TTL left when checked under the lock (daemon only)
	owned bool          // this batch holds the key's lock
	lost  bool          // a lease extension found the lock lost

	result      string
	err         error
	ttl         time.Duration // the TTL written
	absent      bool          // the origin had no row: the missing policy applied
	rescheduled bool          // the daemon's fail-safe already rescheduled this key
	delete      bool          // the missing policy deleted the key
}

// pipeline is one batch's run through the refresh pipeline, shared by the daemon's refresh-ahead and by
// warmups (keepwarm warmup and [[schedule]] runs):
//
//  1. wait for the keyspace's origin budget (token bucket);
//  2. acquire the locks, pipelined (one round trip); keys locked elsewhere are skipped as ResultLocked;
//  3. optionally re-check the owned keys under their locks (the daemon's PTTL check);
//  4. run one origin query for the rest, extending the leases every lock_ttl/3 while it runs;
//  5. publish values with the token-checked script, pipelined, with the TTL that ttl returns, and apply the
//     missing policy;
//  6. release every lock still held, even when ctx was cancelled.
type pipeline struct {
	k     *keyspace
	cfg   KeyspaceConfig
	token string
	// ttl returns the TTL of one written value: jittered for refreshes, spread for warmups. It is called with
	// the keyspace's lock held (which guards k.rnd).
	ttl func() time.Duration
	// recheck, when set, sees the owned items under their locks and returns those that still need the origin;
	// it settles the others itself.
	recheck func(ctx context.Context, items []*item) ([]*item, error)
	// failSafe, when set, handles an origin failure for the fetched items; without it they fail (ResultError).
	failSafe func(ctx context.Context, items []*item, cause error)
	// extra limits the batch further than the keyspace's budget (a warmup's --rate); may be nil.
	extra interface {
		WaitN(ctx context.Context, n int) error
	}

	rebuild time.Duration // duration of the origin query, once run
	start   time.Time     // when publishing began: a written key expires no earlier than start + ttl
}

// run sends items through the pipeline. It returns an error, with no item settled, only when the batch as a
// whole could not run (ctx ended while waiting for budget, or Redis failed before or at publishing): the
// caller retries or counts those items as failed.
func (p *pipeline) run(ctx context.Context, items []*item) error {
	p.token = lockstep.NewToken()
	defer p.releaseOwned(ctx, items)
	if p.extra != nil {
		if err := p.extra.WaitN(ctx, len(items)); err != nil {
			return err
		}
	}
	if err := p.k.limiter.Wait(ctx); err != nil {
		return err
	}
	owned, err := p.acquire(ctx, items)
	if err != nil {
		return err
	}
	if p.recheck != nil && len(owned) > 0 {
		if owned, err = p.recheck(ctx, owned); err != nil {
			return err
		}
	}
	if len(owned) == 0 {
		return nil
	}
	return p.fetchAndPublish(ctx, owned)
}

// acquire takes the items' locks in one pipelined round trip and returns the items it owns.
func (p *pipeline) acquire(ctx context.Context, items []*item) ([]*item, error) {
	locks := make([]string, len(items))
	for i, it := range items {
		locks[i] = it.ks.Lock
	}
	ok, err := lockstep.AcquireMany(ctx, p.k.w.rdb, locks, p.token, p.cfg.LockTTL)
	if err != nil {
		return nil, err
	}
	var owned []*item
	p.k.mu.Lock()
	for i, it := range items {
		if ok[i] {
			it.owned = true
			owned = append(owned, it)
		} else {
			it.result = ResultLocked
		}
	}
	p.k.mu.Unlock()
	p.k.w.m.locks.WithLabelValues(p.cfg.Name, "acquired").Add(float64(len(owned)))
	p.k.w.m.locks.WithLabelValues(p.cfg.Name, "held").Add(float64(len(items) - len(owned)))
	return owned, nil
}

// fetchAndPublish runs one origin query for items and publishes the results.
func (p *pipeline) fetchAndPublish(ctx context.Context, items []*item) error {
	cfg := p.cfg
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.id
	}
	// The query may run up to the statement timeout plus a margin; the leases are extended while it runs, and
	// never past that bound.
	qctx, cancel := context.WithTimeout(ctx, cfg.StatementTimeout+cfg.LockTTL/3)
	stopLease := p.extendLeases(qctx, items)
	qstart := time.Now()
	values, missing, err := cfg.Src.Fetch(qctx, ids)
	p.rebuild = time.Since(qstart)
	cancel()
	stopLease()
	p.k.w.m.originSeconds.WithLabelValues(cfg.Name).Observe(p.rebuild.Seconds())
	if err != nil && ctx.Err() != nil {
		return ctx.Err() // shutdown or an interrupted warmup: not the origin's failure
	}
	if err != nil {
		p.k.w.m.originQueries.WithLabelValues(cfg.Name, "error").Inc()
		if p.failSafe != nil {
			p.failSafe(ctx, items, err)
			return nil
		}
		for _, it := range items {
			it.result, it.err = ResultError, err
		}
		return nil
	}
	p.k.w.m.originQueries.WithLabelValues(cfg.Name, "ok").Inc()
	p.k.w.m.originRows.WithLabelValues(cfg.Name).Add(float64(len(values)))
	p.k.originOK()
	_ = missing // every id not in values is missing (the Source contract)

	var writes []lockstep.Write
	var witems []*item
	p.k.mu.Lock()
	for _, it := range items {
		if it.lost {
			it.result = ResultLockLost
			continue
		}
		v, found := values[it.id]
		switch {
		case found && cfg.MaxValueBytes > 0 && len(v) > cfg.MaxValueBytes:
			it.result = ResultError
			it.err = fmt.Errorf("value of %d bytes exceeds max_value_bytes %d", len(v), cfg.MaxValueBytes)
		case found:
			it.ttl = p.ttl()
			writes = append(writes, lockstep.Write{Keys: it.ks, Token: p.token, Value: v, TTL: it.ttl,
				StaleTTL: cfg.StaleTTL, Rebuild: p.rebuild})
			witems = append(witems, it)
		default: // missing: the origin has no row (or a NULL value)
			it.absent = true
			switch cfg.Missing {
			case MissingDelete:
				it.delete = true
				writes = append(writes, lockstep.Write{Keys: it.ks, Token: p.token, Delete: true})
				witems = append(witems, it)
			case MissingTombstone:
				it.ttl = cfg.TombstoneTTL
				writes = append(writes, lockstep.Write{Keys: it.ks, Token: p.token, Value: cfg.Tombstone,
					TTL: cfg.TombstoneTTL, Rebuild: p.rebuild})
				witems = append(witems, it)
			default: // keep: leave the current value to its TTL; the lock is released at the end
				it.result = ResultMissing
			}
		}
	}
	p.k.mu.Unlock()
	for _, it := range items {
		if it.result == ResultError && it.err != nil {
			p.k.log.Warn("refusing value", "id", it.id, "error", it.err)
		}
	}
	if len(writes) == 0 {
		return nil
	}
	p.start = p.k.w.now()
	results, err := lockstep.PublishMany(ctx, p.k.w.rdb, writes)
	if err != nil {
		return err
	}
	p.k.mu.Lock()
	defer p.k.mu.Unlock()
	for i, it := range witems {
		it.owned = false // the publish script deleted the lock, or it was not ours any more
		switch {
		case results[i] != nil:
			it.result, it.err = ResultLockLost, results[i]
		case it.absent:
			it.result = ResultMissing
		default:
			it.result = ResultOK
		}
	}
	return nil
}

// extendLeases extends the batch's locks every LockTTL/3 while the origin query runs, until ctx (bounded by the
// statement timeout plus a margin) ends or the returned stop is called. A key whose extension fails has lost
// its lock; its result is dropped (the publish script would refuse it anyway).
func (p *pipeline) extendLeases(ctx context.Context, items []*item) (stop func()) {
	k, cfg := p.k, p.cfg
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
			ok, err := lockstep.ExtendMany(ctx, k.w.rdb, locks, p.token, cfg.LockTTL)
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

// releaseOwned releases every lock the batch still holds. It runs even when ctx was cancelled (shutdown past
// the grace period, an interrupted warmup), with its own short deadline, so that apps never wait out lock_ttl
// because of keepwarm.
func (p *pipeline) releaseOwned(ctx context.Context, items []*item) {
	var locks []string
	p.k.mu.Lock()
	for _, it := range items {
		if it.owned {
			locks = append(locks, it.ks.Lock)
			it.owned = false
		}
	}
	p.k.mu.Unlock()
	if len(locks) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if err := lockstep.ReleaseMany(rctx, p.k.w.rdb, locks, p.token); err != nil {
		p.k.log.Warn("release locks", "count", len(locks), "error", err)
	}
}
