package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/sources/postgres"
	"github.com/keepwarm/keepwarm/warmer"
)

// stampedeStrategy is one row of the stampede benchmark: a way for the workers to read the hot key. The harness
// (stampedeEnv.runStrategy) runs every strategy alike, for the same duration against the same workload, and
// measures the same columns; adding a strategy is adding an entry to stampedeStrategies.
type stampedeStrategy struct {
	name, desc string
	// start sets the strategy up for one run: one read function per worker, and what to stop and release
	// afterwards. It is called once per run, before the warm-up.
	start func(ctx context.Context, r *strategyRun) (*strategySetup, error)
}

// stampedeStrategies are the strategies of `keepwarm-bench stampede`, in the order "all" runs them.
var stampedeStrategies = []stampedeStrategy{
	{"fetch", "naive cache-aside: GET, on a miss recompute and SET EX; no lock", referenceStrategy(false, false)},
	{"locked", "on a miss SET NX a lock and recompute; a loser sleeps 10 ms and retries", referenceStrategy(false, true)},
	{"xfetch", "XFetch probabilistic early recompute (Vattani et al., VLDB 2015); no lock", referenceStrategy(true, false)},
	{"xlocked", "XFetch plus the lock; a worker that loses the lock returns the current value", referenceStrategy(true, true)},
	{"lockstep", "the lockstep client alone (token lock, XFetch β=1, stale copy), no daemon", lockstepStrategy(false)},
	{"keepwarm", "the lockstep client (token lock, stale copy, access recording) with the warmer running in-process", lockstepStrategy(true)},
}

// lockPoll is how long a reader that found the lock held sleeps before it reads the value again: the locked
// reference strategies here and the lock-based peers (redislock, redsync) of `keepwarm-bench peers` alike.
const lockPoll = 10 * time.Millisecond

// strategyByName returns the strategy called name.
func strategyByName(name string) (stampedeStrategy, bool) {
	for _, st := range stampedeStrategies {
		if st.name == name {
			return st, true
		}
	}
	return stampedeStrategy{}, false
}

// strategyRun is what the harness gives a strategy's start for one run.
type strategyRun struct {
	*stampedeEnv
	name   string
	prefix string // the strategy's own key prefix: every key it writes starts with it
	// recompute runs the apps' origin query (pg_sleep δ, logged as the app's), tracked by origin. A read calls it
	// for every recompute it does itself.
	recompute func(ctx context.Context) ([]byte, error)
	origin    *origin
	// cnt and measuring are for events that happen outside a read (a background refresh): count them in cnt
	// only while measuring is true. Events of a read go in its readOutcome.
	cnt       *stampedeCounters
	measuring *atomic.Bool
}

// strategySetup is a strategy set up for one run.
type strategySetup struct {
	// readers holds one read function per worker (c.workers of them); worker i calls only readers[i], so a
	// reader may keep per-worker state without locking.
	readers []func(context.Context) readOutcome
	// stop, when set, stops what the strategy runs in the background (the in-process warmer) and returns the
	// warmer's refreshes by result, or nil. The harness calls it right after the measured window.
	stop func() map[string]int64
	// close, when set, releases the strategy's clients and keys; the harness calls it when the run ends, also
	// after an error.
	close func()
}

// finish calls stop once; later calls return nil.
func (s *strategySetup) finish() map[string]int64 {
	if s.stop == nil {
		return nil
	}
	stop := s.stop
	s.stop = nil
	return stop()
}

// release stops the strategy if the harness has not, then closes it.
func (s *strategySetup) release() {
	s.finish()
	if s.close != nil {
		s.close()
	}
}

// referenceStrategy is a strategy written with raw go-redis, as stampede.php writes it (see referenceReader).
func referenceStrategy(xf, locked bool) func(context.Context, *strategyRun) (*strategySetup, error) {
	return func(_ context.Context, r *strategyRun) (*strategySetup, error) {
		s := &strategySetup{}
		for range r.c.workers {
			s.readers = append(s.readers, r.referenceReader(r.name, r.prefix, xf, locked, r.recompute))
		}
		return s, nil
	}
}

// lockstepStrategy is the lockstep client, one per worker (as one app process each): alone with XFetch, or,
// with keepwarm, recording accesses for a warmer that runs in-process on its own Redis client and pool.
func lockstepStrategy(keepwarm bool) func(context.Context, *strategyRun) (*strategySetup, error) {
	return func(ctx context.Context, r *strategyRun) (_ *strategySetup, err error) {
		c := r.c
		keys, err := lockstep.NewKeys(r.prefix+"value:${id}", "", lockstep.DefaultStaleTemplate, "")
		if err != nil {
			return nil, err
		}
		ksName := "kwbench-stampede-" + r.run + "-" + r.name
		var closers []func()
		s := &strategySetup{close: func() {
			for _, f := range closers {
				f()
			}
			r.app.Del(context.WithoutCancel(ctx), lockstep.AccessKey(ksName), "keepwarm:decay:"+ksName)
		}}
		defer func() {
			if err != nil {
				s.release()
			}
		}()
		load := func(ctx context.Context, id string) ([]byte, error) { return r.recompute(ctx) }
		for range c.workers {
			wk := &lsWorker{cnt: r.cnt, measuring: r.measuring}
			opts := []lockstep.Option{
				lockstep.WithLockTTL(c.lockTTL),
				lockstep.WithJitter(c.jitter),
				lockstep.WithStale(time.Hour),
				lockstep.WithRecorder(wk),
				lockstep.WithLogger(r.log),
			}
			if !keepwarm {
				opts = append(opts, lockstep.WithXFetch(c.beta))
			} else {
				opts = append(opts, lockstep.WithAccessRecording(1))
			}
			cl, err := lockstep.New(r.app, ksName, keys, load, c.expiry, opts...)
			if err != nil {
				return nil, err
			}
			closers = append(closers, func() { _ = cl.Close(context.Background()) })
			s.readers = append(s.readers, func(ctx context.Context) readOutcome {
				wk.cur = readOutcome{}
				_, err := cl.Get(ctx, "1")
				out := wk.cur
				out.err = err
				return out
			})
		}
		if !keepwarm {
			return s, nil
		}
		dsrc, err := r.source(r.dpool, r.name, "daemon")
		if err != nil {
			return nil, err
		}
		w, err := warmer.New(r.daemon, warmer.Config{Logger: r.log, Keyspaces: []warmer.KeyspaceConfig{{
			Name: ksName, Keys: keys, Src: countingSource{o: r.origin, src: dsrc}, TTL: c.expiry, Jitter: c.jitter,
			RefreshAhead: c.refreshAhead, LockTTL: c.lockTTL, StatementTimeout: min(c.lockTTL/2, c.expiry/4),
			StaleTTL: time.Hour, TopN: 1, PollInterval: time.Second,
		}}})
		if err != nil {
			return nil, err
		}
		stopWarmer := startWarmer(context.WithoutCancel(ctx), w)
		s.stop = func() map[string]int64 {
			var refreshes map[string]int64
			for _, st := range w.Status(0) {
				refreshes = st.Refreshes
			}
			stopWarmer()
			return refreshes
		}
		return s, nil
	}
}

// countingSource is the warmer's Source in the keepwarm strategy: the PostgreSQL source, tracked by origin.
type countingSource struct {
	o   *origin
	src *postgres.Source
}

// ValidID is the PostgreSQL source's id check (warmer.IDValidator), so that the warmer's doors see it.
func (s countingSource) ValidID(id string) error { return s.src.ValidID(id) }

func (s countingSource) Fetch(ctx context.Context, ids []string) (map[string][]byte, []string, error) {
	var vals map[string][]byte
	var missing []string
	err := s.o.do(true, func() error {
		var err error
		vals, missing, err = s.src.Fetch(ctx, ids)
		return err
	})
	return vals, missing, err
}

// lsWorker is a lockstep.Recorder that marks its worker's current Get. Events of background refreshes (after Get
// returned) are counted directly, inside the measured window only.
type lsWorker struct {
	lockstep.NopRecorder
	cur       readOutcome
	cnt       *stampedeCounters
	measuring *atomic.Bool
}

func (w *lsWorker) Miss(string)       { w.cur.miss = true }
func (w *lsWorker) StaleServe(string) { w.cur.stale = true }
func (w *lsWorker) EarlyRefresh(string) {
	w.cur.early = true
}
func (w *lsWorker) LockContention(string) {
	// Followers (in Get) and skipped XFetch refreshes (in the background) both land here; count each one.
	if w.measuring.Load() {
		w.cnt.contention.Add(1)
	}
}

// referenceReader returns one worker's read of a reference strategy, written with raw go-redis as
// stampede.php writes it with Predis (value, lock and δ under their own keys; lock released with DEL). The four
// reference strategies are two choices: when to recompute (on a miss: fetch and locked; on a miss or an XFetch
// draw: xfetch and xlocked) and whether a recompute takes the lock first (locked and xlocked).
func (e *stampedeEnv) referenceReader(name, sp string, xf, locked bool, recompute func(context.Context) ([]byte, error)) func(context.Context) readOutcome {
	c := e.c
	rdb := e.app
	key, lock, deltaKey := sp+"value", sp+"lock", sp+"delta"
	deadline := func() time.Time { return time.Now().Add(c.lockTTL + 30*time.Second) }
	read := func(ctx context.Context) (v []byte, pttl time.Duration, delta time.Duration, err error) {
		var g *redis.StringCmd
		var p *redis.DurationCmd
		var d *redis.StringCmd
		_, err = rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			p = pipe.PTTL(ctx, key)
			g = pipe.Get(ctx, key)
			d = pipe.Get(ctx, deltaKey)
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, 0, 0, err
		}
		v, gerr := g.Bytes()
		if gerr != nil {
			v = nil
		}
		ms, _ := strconv.ParseFloat(d.Val(), 64)
		return v, p.Val(), time.Duration(ms * float64(time.Millisecond)), nil
	}
	get := func(ctx context.Context) ([]byte, error) {
		v, err := rdb.Get(ctx, key).Bytes()
		if errors.Is(err, redis.Nil) {
			return nil, nil
		}
		return v, err
	}
	xfetch := func(pttl, delta time.Duration) bool {
		now := time.Now()
		return lockstep.XFetch(now, now.Add(pttl), delta, c.beta, 1-rand.Float64())
	}

	// check reads the value and says whether this read recomputes; reread reads it again while waiting for the
	// lock; fill recomputes and writes the value.
	var check func(ctx context.Context) (v []byte, o readOutcome, must bool)
	var reread func(ctx context.Context) ([]byte, error)
	var fill func(ctx context.Context) error
	if !xf {
		check = func(ctx context.Context) (v []byte, o readOutcome, must bool) {
			v, err := get(ctx)
			if err != nil || v != nil {
				o.err = err
				return v, o, false
			}
			o.miss = true
			return nil, o, true
		}
		reread = get
		fill = func(ctx context.Context) error {
			v, err := recompute(ctx)
			if err != nil {
				return err
			}
			return rdb.Set(ctx, key, v, c.expiry).Err()
		}
	} else {
		check = func(ctx context.Context) (v []byte, o readOutcome, must bool) {
			v, pttl, delta, err := read(ctx)
			switch {
			case err != nil:
				o.err = err
				return v, o, false
			case v == nil:
				o.miss = true
			case xfetch(pttl, delta):
				o.early = true
			default:
				return v, o, false
			}
			return v, o, true
		}
		reread = func(ctx context.Context) ([]byte, error) {
			v, _, _, err := read(ctx)
			return v, err
		}
		fill = func(ctx context.Context) error { // the value and its δ, for the next reads' XFetch
			t0 := time.Now()
			v, err := recompute(ctx)
			if err != nil {
				return err
			}
			delta := time.Since(t0)
			_, err = rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
				pipe.Set(ctx, key, v, c.expiry)
				pipe.Set(ctx, deltaKey, strconv.FormatFloat(float64(delta)/1e6, 'f', 3, 64), c.expiry)
				return nil
			})
			return err
		}
	}

	// withLock is the lock loop of locked and xlocked: SET NX the lock; the winner fills and DELs the lock; a loser
	// that holds a value (an early recompute) returns it ("ducks out"), one without sleeps 10 ms and reads again,
	// until the value is there or lockTTL + 30 s have passed.
	withLock := func(ctx context.Context, v []byte, o readOutcome) readOutcome {
		for end := deadline(); time.Now().Before(end); {
			ok, err := rdb.SetNX(ctx, lock, "acquired", c.lockTTL).Result()
			if err != nil {
				o.err = err
				return o
			}
			if ok {
				o.err = fill(ctx)
				rdb.Del(ctx, lock)
				return o
			}
			o.contention = true
			if v != nil {
				o.ducked = true
				return o
			}
			time.Sleep(lockPoll)
			if v, o.err = reread(ctx); o.err != nil || v != nil {
				return o
			}
		}
		o.err = errors.New(name + ": gave up waiting for the value")
		return o
	}

	return func(ctx context.Context) readOutcome {
		v, o, must := check(ctx)
		if e.checked != nil {
			e.checked()
		}
		switch {
		case !must:
			return o
		case locked:
			return withLock(ctx, v, o)
		default:
			o.err = fill(ctx)
			return o
		}
	}
}
