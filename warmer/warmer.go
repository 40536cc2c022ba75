package warmer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// DefaultGrace is how long in-flight refreshes may run after shutdown begins before they are cancelled.
const DefaultGrace = 10 * time.Second

// Config configures a Warmer. Zero fields take the defaults noted on them.
type Config struct {
	Keyspaces []KeyspaceConfig
	// Grace bounds how long in-flight refreshes may finish after Run's context ends; default DefaultGrace.
	// Every lock they hold is released either way.
	Grace time.Duration
	// Notifications subscribes to Redis keyspace notifications (expired, evicted, del, set) for early notice, on
	// every master of a Cluster. PTTL reconciliation runs either way and is the ground truth; notifications are
	// lost across reconnects. See Warmer.NotificationsHealthy.
	Notifications bool
	// AutoNotifyFlags: with Notifications, add the notify-keyspace-events flags the warmer needs ("Exeg$", see
	// MissingNotifyFlags) to each node's setting with CONFIG SET, after every (re)subscribe and check, where the
	// ACL allows (+config|set); a refusal is logged once per node. The config's notifications = "auto".
	AutoNotifyFlags bool
	// NodeCheckInterval is how often, with Notifications, the warmer re-reads the Cluster's masters and every
	// node's notify-keyspace-events; default DefaultNodeCheckInterval.
	NodeCheckInterval time.Duration
	// EventQueue bounds, with Notifications, how many hot ids may have events waiting for one keyspace's loop
	// (events for cold ids are dropped, and events for one id coalesce); beyond it events are dropped and every
	// hot key is re-checked by the reconciliation. Default DefaultEventQueue.
	EventQueue int
	// FlushCheckInterval is how often the flush canary is rewritten (flush.go): a FLUSHDB, FLUSHALL, SWAPDB or
	// a restart that emptied Redis is noticed within it, and every hot key is re-read at once. Default
	// DefaultFlushCheckInterval; negative turns the canary off.
	FlushCheckInterval time.Duration
	// DB is the Redis database number, used to match keyspace-notification channels; default 0.
	DB int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the warmer's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Clock is the one clock of the warmer and its schedules: expiry estimates and due times are read from it,
	// and the keyspace loops and Cron wait on its timers. Default clockwork.NewRealClock(); tests pass a
	// clockwork.FakeClock.
	Clock clockwork.Clock
	// Seed seeds jitter and XFetch draws; 0 seeds from the runtime's random source.
	Seed uint64
	// Fleet makes several replicas share the hot keys, each refreshing the ones it owns (see FleetConfig); the
	// zero value shares nothing.
	Fleet FleetConfig
}

// Warmer keeps the hot keys of its keyspaces warm: it tracks which ids are hot, learns when their cache keys
// expire, and refreshes them from their Source shortly before, under the lockstep token lock. Build it with
// New and start it with Run; Update swaps the keyspace configuration while it runs.
type Warmer struct {
	rdb  redis.UniversalClient
	cfg  Config
	log  *slog.Logger
	m    *metrics
	now  func() time.Time
	seed atomic.Uint64

	mu     sync.Mutex
	spaces map[string]*keyspace
	// spaceList is spaces as a slice, published after each change (setSpaces) and never written again, for the
	// notification listener, which reads it on every event without mu.
	spaceList atomic.Pointer[[]*keyspace]
	// startLoop starts a keyspace's scheduler loop while Run runs (nil otherwise), so that Update starts the
	// keyspaces it adds.
	startLoop func(*keyspace)

	progress  atomic.Int64 // unix nanos of the last scheduler loop pass of any keyspace
	lastFlush atomic.Int64 // unix nanos (Config.Clock) of the last flush the canary noticed; 0 before any
	running   atomic.Bool
	checks    checks        // keyspaces whose source check has not passed yet (see Checker)
	notify    notifier      // the keyspace-notification listener (notifications.go)
	fleet     *fleet        // nil when sharing is off
	trust     trustState    // for the reconciliation (reconcile.go)
	refusals  writeRefusals // whether Redis takes writes (refusals.go)
	oom       outage        // the episode of refused new keys, logged once (outage.go; its own lock)
}

// New validates cfg and returns a Warmer. The error names every invalid field of every keyspace.
func New(rdb redis.UniversalClient, cfg Config) (*Warmer, error) {
	if rdb == nil {
		return nil, errors.New("warmer: nil redis client")
	}
	if cfg.Grace == 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	spaces, err := validate(cfg.Keyspaces)
	fleetCfg, ferr := cfg.Fleet.Resolve()
	if err = errors.Join(err, ferr); err != nil {
		return nil, err
	}
	cfg.Fleet = fleetCfg
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("warmer: register metrics: %w", err)
	}
	w := &Warmer{rdb: rdb, cfg: cfg, log: cfg.Logger, m: m, now: cfg.Clock.Now,
		spaces: make(map[string]*keyspace)}
	w.notify.w = w
	if err := w.registerRefusals(cfg.Registerer); err != nil {
		return nil, fmt.Errorf("warmer: register metrics: %w", err)
	}
	if cfg.Fleet.Key != "" {
		if w.fleet, err = newFleet(w, cfg.Fleet, cfg.Registerer); err != nil {
			return nil, fmt.Errorf("warmer: register metrics: %w", err)
		}
	}
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()
	}
	w.seed.Store(cfg.Seed)
	next := make(map[string]*keyspace, len(spaces))
	for _, c := range spaces {
		next[c.Name] = w.newKeyspace(c)
	}
	w.setSpaces(next)
	return w, nil
}

// setSpaces installs the keyspaces in force and publishes them for the listener (spaceList). Callers hold mu,
// or own w alone (New).
func (w *Warmer) setSpaces(spaces map[string]*keyspace) {
	w.spaces = spaces
	list := make([]*keyspace, 0, len(spaces))
	for _, k := range spaces {
		list = append(list, k)
	}
	w.spaceList.Store(&list)
}

func validate(cfgs []KeyspaceConfig) ([]KeyspaceConfig, error) {
	var errs []error
	out := make([]KeyspaceConfig, 0, len(cfgs))
	seen := map[string]bool{}
	for _, c := range cfgs {
		d, err := c.withDefaults()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if seen[d.Name] {
			errs = append(errs, fmt.Errorf("keyspace %q: name: duplicate", d.Name))
		}
		seen[d.Name] = true
		out = append(out, d)
	}
	return out, errors.Join(errs...)
}

// Update replaces the keyspace configuration of a running (or not yet running) Warmer, and returns once it is
// in force. It validates first and changes nothing on error. Keyspaces whose key templates are unchanged keep
// their tracked state; new ones start; removed ones stop after their in-flight refreshes.
func (w *Warmer) Update(cfgs []KeyspaceConfig) error {
	spaces, err := validate(cfgs)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.applyLocked(spaces, w.startLoop)
	return nil
}

// Progress returns when a scheduler loop last completed a pass. A systemd watchdog uses it to stop pinging
// when the scheduler is wedged.
func (w *Warmer) Progress() time.Time { return time.Unix(0, w.progress.Load()) }

func (w *Warmer) tick() { w.progress.Store(time.Now().UnixNano()) }

// Run starts the keyspaces' scheduler loops and blocks until ctx ends. A keyspace whose Source is a Checker starts
// once its check passes, retried with back-off meanwhile (see Checker and Failing), so one broken keyspace does not
// stop the others. It then stops scheduling, lets in-flight
// refreshes finish within Config.Grace (cancelling them after it), releases every lock they hold, and returns
// nil. It returns an error only if it was already running.
func (w *Warmer) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("warmer: already running")
	}
	defer w.running.Store(false)
	w.tick()
	// Refresh batches run on workCtx, which outlives ctx by the grace period so they can finish cleanly.
	workCtx, workCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer workCancel()
	var loops sync.WaitGroup
	w.mu.Lock()
	w.startLoop = func(k *keyspace) { w.startKeyspace(ctx, workCtx, &loops, k) }
	for _, k := range w.spaces {
		w.startLoop(k)
	}
	w.mu.Unlock()
	if w.fleet != nil {
		// The keyspaces start owning nothing (joiningView) and learn their hot sets; the replica joins the fleet
		// once they have (or after joinWait), so that the keys it takes over are keys it knows. If the first
		// heartbeat fails, this replica owns every key until one succeeds.
		w.fleet.join(ctx, w.keyspaces())
		loops.Add(2)
		go func() {
			defer loops.Done()
			w.fleet.run(ctx)
		}()
		go func() {
			defer loops.Done()
			w.fleet.claimMisses(ctx)
		}()
	}
	if w.cfg.FlushCheckInterval >= 0 {
		loops.Add(1)
		go func() {
			defer loops.Done()
			w.watchFlush(ctx)
		}()
	}
	if w.cfg.Notifications {
		loops.Add(1)
		go func() {
			defer loops.Done()
			w.notify.listen(ctx)
		}()
	}
	// With no keyspace there is no scheduler loop to report progress; the Run loop itself does.
	idle := time.NewTicker(time.Second)
	defer idle.Stop()
	for {
		select {
		case <-idle.C:
			w.mu.Lock()
			if len(w.spaces) == 0 {
				w.tick()
			}
			w.mu.Unlock()
		case <-ctx.Done():
			w.log.Info("warmer stopping: waiting for in-flight refreshes", "grace", w.cfg.Grace)
			w.mu.Lock()
			w.startLoop = nil // an Update from now on starts no loop
			w.mu.Unlock()
			loops.Wait()
			spaces := w.keyspaces()
			done := make(chan struct{})
			go func() {
				for _, k := range spaces {
					k.batches.Wait()
				}
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(w.cfg.Grace):
				w.log.Warn("warmer: grace period over; cancelling in-flight refreshes", "grace", w.cfg.Grace)
				workCancel()
				<-done
			}
			return nil
		}
	}
}

// applyLocked installs a validated keyspace set; start launches a new keyspace's loop when running.
func (w *Warmer) applyLocked(spaces []KeyspaceConfig, start func(*keyspace)) {
	next := make(map[string]*keyspace, len(spaces))
	for _, c := range spaces {
		if k, ok := w.spaces[c.Name]; ok && sameLayout(k.config(), c) {
			k.update(c)
			next[c.Name] = k
			continue
		}
		k := w.newKeyspace(c)
		next[c.Name] = k
		if old, ok := w.spaces[c.Name]; ok {
			old.stop()
		}
		if start != nil {
			start(k)
		}
	}
	for name, k := range w.spaces {
		if _, ok := next[name]; !ok {
			k.stop()
			w.m.forget(name)
		}
	}
	w.setSpaces(next)
}

func sameLayout(a, b KeyspaceConfig) bool {
	return a.Keys.Cache.String() == b.Keys.Cache.String() && a.Keys.Lock.String() == b.Keys.Lock.String() &&
		a.Keys.Stale.String() == b.Keys.Stale.String() && a.Keys.Meta.String() == b.Keys.Meta.String() &&
		a.AccessKey == b.AccessKey
}

// Keyspaces returns the names of the configured keyspaces.
func (w *Warmer) Keyspaces() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.spaces))
	for n := range w.spaces {
		out = append(out, n)
	}
	return out
}

// keyspaces returns the keyspaces in force, in no order (a copy: the caller may range over it without w.mu).
func (w *Warmer) keyspaces() []*keyspace {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]*keyspace, 0, len(w.spaces))
	for _, k := range w.spaces {
		out = append(out, k)
	}
	return out
}

func (w *Warmer) keyspace(name string) *keyspace {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.spaces[name]
}

func (w *Warmer) newRand() *rand.Rand {
	s := w.seed.Add(0x9e3779b97f4a7c15)
	return rand.New(rand.NewPCG(s, s>>1|1))
}
