package warmer

import (
	"context"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/keepwarm/keepwarm/warmer/internal/mailbox"
)

// keyspace is the state of one keyspace, owned by its scheduler loop. Its concepts live in their own files:
//
//   - keyspace.go: identity, configuration, the loop's state (loopState, this file); internal/mailbox: how other
//     goroutines reach it;
//   - scheduler.go: the loop, dispatch, and when each hot key falls due (lead, XFetch offset, back-off);
//     keyheap.go: the due and check queues;
//   - heat.go, selection.go (with the tracker), lfu.go, invalid.go: the hot set (access-set and LFU signals,
//     admission, refresh feedback and the cut at top_n, skipped ids);
//   - expiry.go: expiry knowledge (PTTL reads, SLO accounting); notifications.go: keyspace notifications;
//     reconcile.go: PTTL re-checks within a budget, trusted or not; eviction.go: hot values vanishing in bulk, a
//     lost access set; flush.go: the flush canary (Redis emptied);
//   - refresh.go, pipeline.go, slots.go: a refresh batch under the token lock, and how it settles;
//     reasons.go: what an error means (its reason label); outage.go: the origin's and Redis's outages, logged
//     once each; sourcecheck.go: the source's check at start, and the refresh streak.
//
// Its fields are immutable or safe for concurrent use on their own, so any goroutine may hold a *keyspace. What
// the scheduler loop owns is a loopState, which only the loop and the messages it runs (mail) can reach.
type keyspace struct {
	name    string                  // immutable: a keyspace renamed by a reload is a new keyspace
	match   *matcher                // immutable: cache key → id (nil when the template has not exactly one ${id})
	w       *Warmer                 // immutable: the daemon (Redis client, clock, metrics)
	log     *slog.Logger            // immutable
	limiter *rate.Limiter           // the origin query rate (safe for concurrent use; reset by update)
	slots   *originSlots            // the origin concurrency, shared by refreshes and warmups (its own lock)
	rnd     *lockedRand             // jitter and XFetch draws (its own lock)
	wake    chan struct{}           // pokes the scheduler loop (buffered, 1)
	mail    *mailbox.Box[loopState] // messages to the loop, the only way other goroutines reach its state
	// cfgNow is the newest configuration, for goroutines other than the loop (config); the loop's own copy, cfg,
	// follows it when the update's message runs.
	cfgNow atomic.Pointer[KeyspaceConfig]
	// published is the state the loop last gave Status (status.go), never written again once stored.
	published atomic.Pointer[KeyspaceStatus]
	// failing is the refresh streak as the loop last settled it, for RefreshFailing (sourcecheck.go).
	failing atomic.Pointer[refreshStreak]
	// polled is closed after the first poll that read the hot-key signals (or found none to read): the hot set
	// is what the access set says, not empty for want of a look (Changes.Resync waits for it).
	polled     chan struct{}
	polledOnce sync.Once
	batches    sync.WaitGroup
	origin     outage // the origin's failures, logged once per outage (its own lock)
	redis      outage // Redis's failures, logged once per outage (its own lock)

	cancelMu sync.Mutex         // guards cancel only
	cancel   context.CancelFunc // stops the scheduler loop

	results    map[string]*atomic.Int64 // refreshes by result, for Status; the map itself is immutable
	hotExpired atomic.Int64             // the SLO counter, for Status

	// hot is the hot set as the loop last published it (publishHot), for the notification listener.
	hot    atomic.Pointer[hotIDSet]
	intake intake // keyspace-notification events for hot ids, waiting for the loop (its own lock)
}

// loopState is what a keyspace's scheduler loop owns: the hot set, the queues, the tracker, the LFU and fleet
// views, the streaks, the reconciliation and eviction state. Only the loop holds a *loopState; every other
// goroutine reaches it with a message (k.mail.Send, mailbox.Call) that the loop runs between its own steps, so
// code that is handed no *loopState cannot touch it, and the compiler checks that. It embeds its keyspace for
// what any goroutine may use (identity, the Warmer, the budget, the published views). Its methods run on the loop,
// or inside a message; goroutines they start (refresh batches) take the keyspace, never the loopState.
type loopState struct {
	*keyspace

	cfg    KeyspaceConfig       // the configuration in force (replaced by update's message)
	tr     *tracker             // every tracked id and its heat
	hotSet map[string]*hotState // the hot ids, each with its expiry knowledge and place in q
	// hotSerial numbers the hot spells (hotState.serial), so that a batch's batchKey tells a spell that ended.
	hotSerial uint64
	q         dueQueue      // hot keys by due time
	adopt     []*hotState   // hot keys whose expiry must be (re)learnt with PTTL
	left      []*hotState   // owned keys that left the hot set after their known expiry, to be read once (judgeLeft)
	lastSync  time.Time     // the last full read of the access set
	lfu       lfuState      // whether Redis LFU counters can be read
	invalid   invalidIDs    // skipped ids not yet reported in the log
	p95       rebuildWindow // recent rebuild durations, for keys not rebuilt yet
	view      *fleetView    // the fleet's members as last read; nil when sharing is off (fleet.go)
	waste     wasteRatio    // the refresh feedback's wasted share (selection.go)
	streak    refreshStreak // failed refresh batches in a row, for RefreshFailing (sourcecheck.go)
	// failSafeBusy: a fail-safe-only batch is in flight (at most one; see dispatch); probes: refresh batches in
	// flight (while the origin fails, at most one is started).
	failSafeBusy bool
	dueGaugeAt   time.Time   // when dispatch last counted the due keys for their gauge
	ownedMemo    ownedMemo   // owned's last count
	leftLog      []leftEntry // keys that left the hot set lately (noteLeft), for Status and a flush's judgement
	// restoreLogged is when restoreLost last logged at Warn.
	restoreLogged time.Time
	// pinnedHotValid is set when the hot set was last computed for a pinned-only keyspace, at the tracker's
	// pinnedGen then (poll skips recomputing it until the pins change).
	pinnedHotValid bool
	pinnedHotGen   uint64
	probes         int

	// Reconciliation (reconcile.go).
	cq              checkQueue // hot keys by the time of their next PTTL check
	checkEpoch      uint64     // trustState.epoch the check times were last planned for
	reconcileBehind bool       // the last tick found checks overdue by more than ReconcileEvery (logged once)

	// Eviction signals (eviction.go).
	vanish     vanishWindow
	accessSeen bool // the last poll read members from the access set
}

// lockedRand is a *rand.Rand safe for concurrent use: the keyspace's jitter and XFetch draws, seeded per
// keyspace (Config.Seed) so that tests are reproducible.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

// Float64 returns a draw in [0, 1).
func (l *lockedRand) Float64() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Float64()
}

func (w *Warmer) newKeyspace(c KeyspaceConfig) *keyspace {
	k := &keyspace{
		name:    c.Name,
		match:   newMatcher(c.Keys.Cache.String()), // the layout never changes for one keyspace (see sameLayout)
		w:       w,
		log:     w.log.With("keyspace", c.Name),
		limiter: rate.NewLimiter(limit(c.OriginRate), burst(c.OriginRate)),
		slots:   newOriginSlots(c.MaxOriginConcurrency),
		rnd:     &lockedRand{r: w.newRand()},
		wake:    make(chan struct{}, 1),
		polled:  make(chan struct{}),
		results: map[string]*atomic.Int64{},
		intake:  intake{limit: w.cfg.EventQueue},
	}
	if k.intake.limit <= 0 {
		k.intake.limit = DefaultEventQueue
	}
	s := &loopState{
		keyspace: k,
		cfg:      c,
		tr:       newTracker(c.MaxTracked, c.DecayHalfLife, c.HistoryHalfLife, w.now().Unix()),
		hotSet:   make(map[string]*hotState),
	}
	if w.fleet != nil {
		s.view = w.fleet.current()
	}
	s.tr.setPinned(c.Pinned, w.now().Unix())
	k.mail = mailbox.New(s) // from here on only the loop and its messages reach s
	for _, r := range []string{ResultOK, ResultFresh, ResultLocked, ResultMissing, ResultLockLost, ResultLockGone, ResultTooLarge, ResultError} {
		k.results[r] = new(atomic.Int64)
	}
	k.cfgNow.Store(&c)
	k.failing.Store(&refreshStreak{})
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

// config is the newest configuration, for any goroutine (the loop itself reads k.cfg).
func (k *keyspace) config() KeyspaceConfig { return *k.cfgNow.Load() }

// update applies a changed configuration with the same key layout, keeping the tracked state. config returns it
// at once; the loop applies it to its state with its next message.
func (k *keyspace) update(c KeyspaceConfig) {
	k.cfgNow.Store(&c)
	k.mail.Send(func(k *loopState) {
		k.cfg = c
		k.tr.resize(c.MaxTracked, c.HistoryHalfLife, k.w.now().Unix())
		k.tr.halfLife = c.DecayHalfLife
		k.tr.setPinned(c.Pinned, k.w.now().Unix())
		// Apply pin changes now rather than at the next poll: an id pinned before a promotion is warmed at once.
		cands := make([]string, 0, len(k.hotSet))
		for id := range k.hotSet {
			cands = append(cands, id)
		}
		k.setHot(k.tr.selectHot(cands, c.TopN, c.MinScore, k.w.now().Unix()))
	})
	k.slots.setLimit(c.MaxOriginConcurrency)
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
