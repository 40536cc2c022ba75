package warmer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"
)

// MaxFailedIDs is how many failed ids a WarmupResult lists.
const MaxFailedIDs = 1000

// IDSource streams the ids of a warmup: it calls emit once per id, in order, and stops early when emit returns
// an error (which it returns). postgres.Source.IDs has this shape; SliceIDs adapts a list.
type IDSource func(ctx context.Context, emit func(id string) error) error

// SliceIDs returns an IDSource over ids.
func SliceIDs(ids []string) IDSource {
	return func(ctx context.Context, emit func(string) error) error {
		for _, id := range ids {
			if err := emit(id); err != nil {
				return err
			}
		}
		return nil
	}
}

// WarmupOptions configure one warmup.
type WarmupOptions struct {
	// Spread, when > 0, gives each written key a TTL drawn uniformly from [ttl, ttl+Spread), so that keys warmed
	// together fall due for refresh evenly over the window instead of in one burst. 0 uses the keyspace's jitter:
	// ttl × (1 + U[0, jitter)).
	Spread time.Duration
	// Rate caps the warmup at this many ids per second, on top of the keyspace's origin_rate and
	// max_origin_concurrency, which always apply: Rate can lower the budget, never raise it. 0 means no extra cap.
	Rate float64
	// DryRun reads the ids but queries no value and writes nothing: the result has Requested, Batches and the
	// projected TTL histogram.
	DryRun bool
	// Progress, when set, is called (never concurrently) after each batch with the counts so far.
	Progress func(WarmupResult)
}

// WarmupResult counts a warmup's ids. Requested = Written + SkippedLocked + Missing + Failed, except when the
// run was interrupted, when ids already read but not processed are in Requested only.
type WarmupResult struct {
	Requested     int64
	Written       int64 // values published
	SkippedLocked int64 // an app (or the daemon) held the key's lock: being rebuilt anyway
	Missing       int64 // the origin had no row; the missing policy was applied
	Failed        int64 // origin, Redis or validation failure; includes NotKept
	// NotKept counts values that were written but gone when checked right after their batch, or when the warmup
	// re-checked every written value before returning (sweepKept): Redis evicted them (maxmemory with an allkeys
	// policy), or something deleted them. They are in Failed and FailedIDs too, not in Written.
	NotKept     int64
	Batches     int64
	FailedIDs   []string // the first MaxFailedIDs failed ids
	FirstError  error    // the first failure's cause
	TTLs        Histogram
	Duration    time.Duration
	Interrupted bool // ctx ended before every id was processed
}

// Histogram counts written TTLs in equal bins over [Min, Max).
type Histogram struct {
	Min, Max time.Duration
	Counts   []int64
}

func newHistogram(lo, hi time.Duration, bins int) Histogram {
	if hi <= lo {
		hi = lo + time.Millisecond
	}
	return Histogram{Min: lo, Max: hi, Counts: make([]int64, bins)}
}

func (h *Histogram) add(d time.Duration) {
	i := int(float64(len(h.Counts)) * float64(d-h.Min) / float64(h.Max-h.Min))
	h.Counts[min(max(i, 0), len(h.Counts)-1)]++
}

// HistogramBins is the number of bins of a WarmupResult's TTL histogram.
const HistogramBins = 10

// Warmup writes the keys of ids in keyspace now, through the same pipeline as refresh-ahead: in batches of
// batch_size it acquires the locks (pipelined), runs one origin query, publishes with the token-checked script
// (pipelined) and releases. Keys whose lock someone else holds are skipped and counted. The keyspace's origin
// budget (origin_rate, max_origin_concurrency) is shared with the daemon's own refreshes. When ctx ends, reading
// stops, batches in flight finish or are abandoned with their locks released, and the result says Interrupted.
// Warmup works whether or not Run is running. It returns an error only for an unknown keyspace or a failing
// IDSource; per-id failures are counted in the result.
func (w *Warmer) Warmup(ctx context.Context, keyspace string, ids IDSource, opt WarmupOptions) (WarmupResult, error) {
	k := w.keyspace(keyspace)
	if k == nil {
		return WarmupResult{}, fmt.Errorf("warmer: unknown keyspace %q", keyspace)
	}
	cfg := k.config()
	if opt.Spread < 0 || opt.Rate < 0 || math.IsNaN(opt.Rate) {
		return WarmupResult{}, fmt.Errorf("warmer: warmup: spread %v and rate %v must not be negative", opt.Spread, opt.Rate)
	}
	start := time.Now()
	var res WarmupResult
	hi := time.Duration(float64(cfg.TTL) * (1 + cfg.Jitter))
	if opt.Spread > 0 {
		hi = cfg.TTL + opt.Spread
	}
	res.TTLs = newHistogram(cfg.TTL, hi, HistogramBins)
	var mu sync.Mutex       // guards res and written
	var written []keptCheck // every value written, for the final sweep (sweepKept)
	ttl := k.jitteredTTL(cfg)
	if opt.Spread > 0 {
		ttl = func() time.Duration { return cfg.TTL + time.Duration(k.rnd.Float64()*float64(opt.Spread)) }
	}
	var extra *rate.Limiter
	if opt.Rate > 0 {
		extra = rate.NewLimiter(rate.Limit(opt.Rate), cfg.BatchSize) // a burst of one batch
	}

	batches := make(chan []string)
	var wg sync.WaitGroup
	workers := max(cfg.MaxOriginConcurrency, 1)
	if opt.DryRun {
		workers = 1
	}
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for batch := range batches {
				if opt.DryRun {
					mu.Lock()
					res.Batches++
					for range batch {
						res.TTLs.add(ttl())
					}
					mu.Unlock()
					continue
				}
				items, invalid := warmItems(cfg, batch)
				var runErr error
				var published time.Time // when the batch published: a written value expires no earlier than this + its TTL
				if len(items) > 0 {
					if err := k.slots.acquire(ctx); err != nil {
						runErr = err
					} else {
						p := k.newPipeline(cfg, ttl)
						if extra != nil {
							p.extra = extra
						}
						runErr = p.run(ctx, items)
						published = p.start
						k.slots.release()
						k.poke() // a refresh batch may be waiting for the slot
						if runErr == nil {
							k.checkKept(ctx, items)
						}
					}
				}
				mu.Lock()
				res.Batches++
				res.add(items, invalid, runErr, ctx.Err() != nil)
				for _, it := range items {
					if it.result == ResultOK {
						written = append(written, keptCheck{id: it.id, key: it.ks.Cache, expiry: published.Add(it.ttl)})
					}
				}
				if opt.Progress != nil {
					opt.Progress(res)
				}
				mu.Unlock()
			}
		}()
	}
	var batch []string
	srcErr := ids(ctx, func(id string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		mu.Lock()
		res.Requested++
		mu.Unlock()
		batch = append(batch, id)
		if len(batch) < cfg.BatchSize {
			return nil
		}
		select {
		case batches <- batch:
			batch = nil
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if len(batch) > 0 && ctx.Err() == nil {
		batches <- batch
	}
	close(batches)
	wg.Wait()
	res.Interrupted = ctx.Err() != nil
	if !res.Interrupted {
		k.sweepKept(ctx, written, &res)
	}
	res.Duration = time.Since(start)
	if srcErr != nil && !res.Interrupted {
		return res, fmt.Errorf("warmer: warmup of keyspace %q: read ids: %w", keyspace, srcErr)
	}
	return res, nil
}

// warmItems turns a batch of ids into pipeline items; invalid ids (the key template refuses them, or the source:
// IDValidator) come back apart, with their errors.
func warmItems(cfg KeyspaceConfig, batch []string) ([]*item, map[string]error) {
	items := make([]*item, 0, len(batch))
	var invalid map[string]error
	seen := make(map[string]bool, len(batch))
	for _, id := range batch {
		if seen[id] {
			continue // a repeated id is written once
		}
		seen[id] = true
		ks, err := cfg.Keys.For(id)
		if v, ok := cfg.Src.(IDValidator); ok && err == nil {
			err = v.ValidID(id)
		}
		if err != nil {
			if invalid == nil {
				invalid = map[string]error{}
			}
			invalid[id] = err
			continue
		}
		items = append(items, &item{id: id, ks: ks})
	}
	return items, invalid
}

// add folds one batch's outcome into r. A batch that could not run (runErr) counts its ids as failed, unless
// the warmup was interrupted.
func (r *WarmupResult) add(items []*item, invalid map[string]error, runErr error, interrupted bool) {
	fail := r.fail
	for id, err := range invalid {
		fail(id, err)
	}
	for _, it := range items {
		switch it.result {
		case ResultOK:
			r.Written++
			r.TTLs.add(it.ttl)
		case ResultLocked:
			r.SkippedLocked++
		case ResultMissing:
			r.Missing++
		case resultNotKept:
			r.NotKept++
			fail(it.id, it.err)
		case ResultLockLost, ResultLockGone, ResultTooLarge, ResultError:
			fail(it.id, it.err)
		default: // not processed: the batch could not run
			if interrupted || errors.Is(runErr, context.Canceled) {
				continue
			}
			err := runErr
			if err == nil {
				err = errors.New("not processed")
			}
			fail(it.id, err)
		}
	}
}

// keptCheck is one value a warmup wrote, for the final sweep: its id, cache key and conservative expiry.
type keptCheck struct {
	id, key string
	expiry  time.Time
}

// sweepKept re-reads, at the end of a warmup, whether every value it wrote is still there (pipelined EXISTS, in
// chunks of pttlChunk): a value evicted (or deleted) after its batch's own check but before the warmup returns
// was not kept, and the result says so (moved from Written to NotKept and Failed). A value whose own TTL ran out
// meanwhile (a warmup longer than the TTL) expired as written and is not counted. When Redis fails to answer, the
// counts are left as they are.
func (k *keyspace) sweepKept(ctx context.Context, written []keptCheck, res *WarmupResult) {
	for start := 0; start < len(written); start += pttlChunk {
		chunk := written[start:min(start+pttlChunk, len(written))]
		cmds := make([]*redis.IntCmd, len(chunk))
		_, err := k.w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, c := range chunk {
				cmds[i] = p.Exists(ctx, c.key)
			}
			return nil
		})
		if err != nil {
			return
		}
		now := time.Now()
		for i, c := range chunk {
			if cmds[i].Val() != 0 || !now.Before(c.expiry.Add(-expiryTolerance)) {
				continue
			}
			res.Written--
			res.NotKept++
			res.fail(c.id, fmt.Errorf("%s: written, then gone before the warmup returned (evicted under maxmemory, or deleted)", c.key))
		}
	}
}

// fail counts id as failed with err (FailedIDs keeps the first MaxFailedIDs, FirstError the first cause).
func (r *WarmupResult) fail(id string, err error) {
	r.Failed++
	if len(r.FailedIDs) < MaxFailedIDs {
		r.FailedIDs = append(r.FailedIDs, id)
	}
	if r.FirstError == nil {
		r.FirstError = err
	}
}

// resultNotKept marks a warmup item that was written and then evicted at once.
const resultNotKept = "not_kept"

// checkKept reads, in one pipelined round trip, whether the values a warmup batch just wrote are still there: under
// maxmemory with an allkeys eviction policy Redis may evict a key right after it was written, and a warmup that
// reported it as written would mislead the operator before a promotion. Those items become resultNotKept. When
// Redis fails to answer, the items are left as they are.
func (k *keyspace) checkKept(ctx context.Context, items []*item) {
	var written []*item
	for _, it := range items {
		if it.result == ResultOK {
			written = append(written, it)
		}
	}
	if len(written) == 0 {
		return
	}
	cmds := make([]*redis.IntCmd, len(written))
	_, err := k.w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, it := range written {
			cmds[i] = p.Exists(ctx, it.ks.Cache)
		}
		return nil
	})
	if err != nil {
		return
	}
	for i, it := range written {
		if cmds[i].Val() == 0 {
			it.result = resultNotKept
			it.err = fmt.Errorf("%s: written, then evicted at once (Redis is at maxmemory)", it.ks.Cache)
		}
	}
}
