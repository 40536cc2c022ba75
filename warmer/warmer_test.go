package warmer_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/sources/postgres"
	"github.com/keepwarm/keepwarm/warmer"
)

// fixture is one test's Redis prefix, PostgreSQL table and source.
type fixture struct {
	rdb    *redis.Client
	pool   *pgxpool.Pool
	prefix string
	table  string // schema-qualified, sanitized
	src    *countingSource
	keys   *lockstep.Keys
}

func newFixture(t *testing.T, rows int) *fixture {
	t.Helper()
	f := &fixture{rdb: testenv.Redis(t), pool: testenv.Postgres(t)}
	f.prefix = testenv.Prefix(t, f.rdb)
	schema := testenv.Schema(t, f.pool)
	f.table = pgx.Identifier{schema, "items"}.Sanitize()
	ctx := context.Background()
	if _, err := f.pool.Exec(ctx, "create table "+f.table+" (id text primary key, body jsonb not null, delay float8 not null default 0)"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(ctx, "insert into "+f.table+" select i::text, jsonb_build_object('id', i, 'v', 1) from generate_series(1, $1) i", rows); err != nil {
		t.Fatal(err)
	}
	var err error
	f.keys, err = lockstep.NewKeys(f.prefix+"item:${id}", "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	f.src = &countingSource{src: f.source(t, "select id, body from "+f.table+" where id = any($1)")}
	return f
}

func (f *fixture) source(t *testing.T, query string) warmer.Source {
	t.Helper()
	src, err := postgres.New(f.pool, postgres.Config{Keyspace: "items", Query: query, StatementTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func (f *fixture) key(id string) string { return f.prefix + "item:" + id }

// countingSource records every id the warmer asked the origin for.
type countingSource struct {
	src     warmer.Source
	mu      sync.Mutex
	queries int
	asked   map[string]int
	before  func(ids []string) // optional hook, run before the query
	after   func(ids []string) // optional hook, run after the query, before its values are returned
}

func (c *countingSource) Fetch(ctx context.Context, ids []string) (map[string][]byte, []string, error) {
	c.mu.Lock()
	c.queries++
	if c.asked == nil {
		c.asked = map[string]int{}
	}
	for _, id := range ids {
		c.asked[id]++
	}
	hook, after := c.before, c.after
	c.mu.Unlock()
	if hook != nil {
		hook(ids)
	}
	values, missing, err := c.src.Fetch(ctx, ids)
	if after != nil {
		after(ids)
	}
	return values, missing, err
}

// ValidID passes the wrapped source's id check on (warmer.IDValidator), so that the warmer's doors see it.
func (c *countingSource) ValidID(id string) error {
	if v, ok := c.src.(interface{ ValidID(string) error }); ok {
		return v.ValidID(id)
	}
	return nil
}

func (c *countingSource) count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.asked[id]
}

func (f *fixture) config(pinned ...string) warmer.KeyspaceConfig {
	return warmer.KeyspaceConfig{
		Name: "items", Keys: f.keys, Src: f.src, TTL: 2 * time.Second, Jitter: 0.1,
		RefreshAhead: 600 * time.Millisecond, LockTTL: 2 * time.Second, StatementTimeout: 500 * time.Millisecond,
		BatchSize: 50, MaxOriginConcurrency: 2, TopN: 10, Pinned: pinned,
		AccessKey:    f.prefix + "access",
		PollInterval: 200 * time.Millisecond, ReconcileEvery: 300 * time.Millisecond,
	}
}

// start runs a warmer until the test ends (or stop is called) and returns its registry.
func start(t *testing.T, rdb redis.UniversalClient, cfg warmer.Config) (w *warmer.Warmer, reg *prometheus.Registry, stop func()) {
	t.Helper()
	reg = prometheus.NewRegistry()
	cfg.Registerer = reg
	w, err := warmer.New(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Error("Run did not return 15 s after cancel")
			}
		})
	}
	t.Cleanup(stop)
	return w, reg, stop
}

// counter sums a metric's samples whose labels include labels (testenv.MetricSum).
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	return testenv.MetricSum(t, reg, name, labels)
}

func TestPinnedKeysStayWarm(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 20)
	cfg := f.config("1", "2", "3")
	_, reg, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	ctx := context.Background()
	testenv.Eventually(t, 3*time.Second, "pinned keys written", func() bool {
		n, _ := f.rdb.Exists(ctx, f.key("1"), f.key("2"), f.key("3")).Result()
		return n == 3
	})
	// Over three TTLs, a pinned key must never be missing and every TTL seen must lie in [0, ttl×(1+jitter)].
	deadline := time.Now().Add(3 * cfg.TTL)
	maxTTL := time.Duration(float64(cfg.TTL) * (1 + cfg.Jitter))
	for time.Now().Before(deadline) {
		for _, id := range []string{"1", "2", "3"} {
			ttl, err := f.rdb.PTTL(ctx, f.key(id)).Result()
			if err != nil {
				t.Fatal(err)
			}
			if ttl <= 0 || ttl > maxTTL {
				t.Fatalf("key %s: PTTL %v outside (0, %v]", id, ttl, maxTTL)
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	if got := counter(t, reg, "keepwarm_warmer_hot_expired_total", nil); got != 0 {
		t.Errorf("SLO counter = %v, want 0", got)
	}
	ok := counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"result": "ok"})
	// 3 keys × (1 initial + ~3 refreshes); each refresh should come once per TTL, not more.
	if ok < 9 || ok > 3*6 {
		t.Errorf("ok refreshes = %v over 3 TTLs of 3 keys, want between 9 and 18", ok)
	}
	v, err := f.rdb.Get(ctx, f.key("2")).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"v": 1, "id": 2}`; string(v) != want {
		t.Errorf("value = %s, want %s (bytes as PostgreSQL returns them)", v, want)
	}
	// Cold ids (never pinned, never accessed) are never refreshed.
	for _, id := range []string{"4", "10", "20"} {
		if n := f.src.count(id); n != 0 {
			t.Errorf("cold id %s queried %d times", id, n)
		}
	}
}

func TestMetricsLint(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	_, reg, stop := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{f.config("1")}})
	testenv.Eventually(t, 3*time.Second, "refresh counted", func() bool {
		return counter(t, reg, "keepwarm_warmer_refreshes_total", nil) > 0
	})
	stop()
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
}

func TestAccessSetMakesKeysHot(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 50)
	cfg := f.config()
	cfg.TopN = 3
	ctx := context.Background()
	// ids 7, 8 and 9 are read the most; 1 a little; the rest never.
	for id, n := range map[string]float64{"7": 100, "8": 90, "9": 80, "1": 2} {
		f.rdb.ZIncrBy(ctx, cfg.AccessKey, n, id)
	}
	w, _, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	testenv.Eventually(t, 3*time.Second, "top 3 written", func() bool {
		n, _ := f.rdb.Exists(ctx, f.key("7"), f.key("8"), f.key("9")).Result()
		return n == 3
	})
	if n, _ := f.rdb.Exists(ctx, f.key("1")).Result(); n != 0 || f.src.count("1") != 0 {
		t.Errorf("id 1 is outside the top 3 but was refreshed (%d queries)", f.src.count("1"))
	}
	st := w.Status(0)
	if len(st) != 1 || st[0].Hot != 3 {
		t.Fatalf("status = %+v, want one keyspace with 3 hot keys", st)
	}
	// A new favourite displaces the coldest hot key.
	f.rdb.ZIncrBy(ctx, cfg.AccessKey, 1000, "42")
	testenv.Eventually(t, 3*time.Second, "new favourite written", func() bool {
		n, _ := f.rdb.Exists(ctx, f.key("42")).Result()
		return n == 1
	})
	hot := map[string]bool{}
	for _, k := range w.Status(0)[0].Keys {
		hot[k.ID] = true
	}
	if !hot["42"] || hot["9"] || len(hot) != 3 {
		t.Errorf("hot = %v, want 42, 7, 8", hot)
	}
}

func TestAppHoldsLockNoOriginQuery(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 5)
	ctx := context.Background()
	ks, _ := f.keys.For("1")
	// An app-side leader is rebuilding id 1 (the raw protocol, as any app would take it).
	if ok, err := f.rdb.SetNX(ctx, ks.Lock, "app-token", 30*time.Second).Result(); err != nil || !ok {
		t.Fatalf("take lock: %v %v", ok, err)
	}
	_, reg, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{f.config("1", "2")}})
	testenv.Eventually(t, 3*time.Second, "id 2 written", func() bool {
		n, _ := f.rdb.Exists(ctx, f.key("2")).Result()
		return n == 1
	})
	testenv.Eventually(t, 3*time.Second, "lock contention counted", func() bool {
		return counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"result": "locked"}) >= 2
	})
	if n := f.src.count("1"); n != 0 {
		t.Fatalf("origin queried %d times for an id whose lock an app holds", n)
	}
	if v, _ := f.rdb.Get(ctx, ks.Lock).Result(); v != "app-token" {
		t.Fatalf("the app's lock was touched: %q", v)
	}
	// The app finishes: publishes its value and releases. The daemon adopts the app's TTL, not rebuilding it.
	f.rdb.Set(ctx, ks.Cache, "from-app", 1500*time.Millisecond)
	f.rdb.Del(ctx, ks.Lock)
	testenv.Eventually(t, 4*time.Second, "daemon refreshes id 1 before it expires", func() bool {
		v, _ := f.rdb.Get(ctx, ks.Cache).Result()
		return strings.HasPrefix(v, "{")
	})
	if got := counter(t, reg, "keepwarm_warmer_hot_expired_total", nil); got != 0 {
		t.Errorf("SLO counter = %v, want 0", got)
	}
}

func TestSlowQueryExtendsLeaseAndLostLockPublishesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	ctx := context.Background()
	slow := f.source(t, "select id, body from "+f.table+" , pg_sleep(0.8) where id = any($1)")
	ks, _ := f.keys.For("1")
	lockTTLs := make(chan time.Duration, 1)
	steal := make(chan struct{}, 1)
	f.src.src = slow
	f.src.before = func([]string) {
		go func() {
			// Wait for the event, not for a time: the lock's TTL goes up while the query runs (the lease was
			// extended). Without extensions it only goes down, and the query outlives the 900 ms lock.
			prev, _ := f.rdb.PTTL(ctx, ks.Lock).Result()
			extended := time.Duration(0)
			for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				ttl, _ := f.rdb.PTTL(ctx, ks.Lock).Result()
				if ttl > prev+50*time.Millisecond {
					extended = ttl
					break
				}
				prev = ttl
			}
			lockTTLs <- extended
			select {
			case <-steal:
				// Another leader takes over: the daemon's lease is lost and it must publish nothing.
				f.rdb.Set(ctx, ks.Lock, "other-leader", 5*time.Second)
				f.rdb.Set(ctx, ks.Cache, "newer-value", 10*time.Second)
			default:
			}
		}()
	}
	cfg := f.config("1")
	cfg.LockTTL = 900 * time.Millisecond
	cfg.StatementTimeout = 800 * time.Millisecond
	cfg.TTL = 10 * time.Second
	cfg.RefreshAhead = time.Second
	steal <- struct{}{}
	_, reg, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	if ttl := <-lockTTLs; ttl == 0 {
		t.Errorf("the lock's TTL never went up during a slow query: the lease was not extended")
	}
	testenv.Eventually(t, 5*time.Second, "lost lock counted", func() bool {
		return counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"result": "lock_lost"}) >= 1
	})
	if v, _ := f.rdb.Get(ctx, ks.Cache).Result(); v != "newer-value" {
		t.Errorf("cache = %q after the daemon lost its lock, want the other leader's %q", v, "newer-value")
	}
	if v, _ := f.rdb.Get(ctx, ks.Lock).Result(); v != "other-leader" {
		t.Errorf("lock = %q, want the other leader's lock untouched", v)
	}
}

// switchSource lets a test take the origin down and bring it back.
type switchSource struct {
	up, down warmer.Source
	isDown   atomic.Bool
}

func (s *switchSource) Fetch(ctx context.Context, ids []string) (map[string][]byte, []string, error) {
	if s.isDown.Load() {
		return s.down.Fetch(ctx, ids)
	}
	return s.up.Fetch(ctx, ids)
}

func TestFailSafeKeepsHotKeysReadable(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	ctx := context.Background()
	// A real PostgreSQL client pointed at a port where nothing listens.
	dead, err := pgxpool.New(ctx, "postgres://keepwarm@127.0.0.1:1/keepwarm?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dead.Close)
	deadSrc, err := postgres.New(dead, postgres.Config{Keyspace: "items", Query: "select 1", StatementTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sw := &switchSource{up: f.src, down: deadSrc}
	cfg := f.config("1", "2")
	cfg.Src = sw
	cfg.MaxStale = time.Minute
	// A 2 s lead (TTL/2) rather than the fixture's 1 s: on a busy machine a failing batch (lock, re-check,
	// refused connection, extension) can take most of a second, and this test is about the fail-safe, not speed.
	cfg.TTL, cfg.RefreshAhead = 4*time.Second, 2*time.Second
	_, reg, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	testenv.Eventually(t, 3*time.Second, "keys written", func() bool {
		n, _ := f.rdb.Exists(ctx, f.key("1"), f.key("2")).Result()
		return n == 2
	})
	sw.isDown.Store(true)
	// For two TTLs with the origin down, the hot keys stay readable.
	deadline := time.Now().Add(2 * cfg.TTL)
	for time.Now().Before(deadline) {
		if n, _ := f.rdb.Exists(ctx, f.key("1"), f.key("2")).Result(); n != 2 {
			t.Fatalf("a hot key expired while the origin was down (fail-safe failed)")
		}
		time.Sleep(25 * time.Millisecond)
	}
	if got := counter(t, reg, "keepwarm_warmer_failsafe_extensions_total", nil); got < 2 {
		t.Errorf("fail-safe extensions = %v, want >= 2", got)
	}
	before := counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"result": "ok"})
	sw.isDown.Store(false)
	testenv.Eventually(t, 10*time.Second, "refreshes resume after the origin is back", func() bool {
		return counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"result": "ok"}) >= before+2
	})
}

func TestFailSafeBoundedByMaxStale(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	ctx := context.Background()
	sw := &switchSource{up: f.src, down: f.source(t, "select id, body from missing_table_for_failsafe where id = any($1)")}
	cfg := f.config("1")
	cfg.Src = sw
	cfg.TTL = time.Second
	cfg.RefreshAhead = 300 * time.Millisecond
	cfg.MaxStale = 700 * time.Millisecond
	_, reg, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	testenv.Eventually(t, 3*time.Second, "key written", func() bool {
		n, _ := f.rdb.Exists(ctx, f.key("1")).Result()
		return n == 1
	})
	sw.isDown.Store(true)
	written := time.Now()
	// Expiry ≤ 1.1 s after the write, plus at most 0.7 s of fail-safe: gone by ~1.8 s (allow scheduling slack).
	testenv.Eventually(t, 4*time.Second, "key expires once max_stale is spent", func() bool {
		n, _ := f.rdb.Exists(ctx, f.key("1")).Result()
		return n == 0
	})
	if gone := time.Since(written); gone < time.Second {
		t.Errorf("key gone %v after the outage began; fail-safe should have kept it past its TTL", gone)
	}
	// The daemon owns up to it: a hot key expired before a refresh could land, and the SLO counter says so.
	testenv.Eventually(t, 2*time.Second, "SLO counter counts the expiry", func() bool {
		return counter(t, reg, "keepwarm_warmer_hot_expired_total", nil) == 1
	})
}

func TestShutdownDuringSlowRefreshLeavesNoLock(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	ctx := context.Background()
	started := make(chan struct{}, 1)
	f.src.src = f.source(t, "select id, body from "+f.table+", pg_sleep(1.5) where id = any($1)")
	f.src.before = func([]string) {
		select {
		case started <- struct{}{}:
		default:
		}
	}
	cfg := f.config("1", "2", "3")
	cfg.LockTTL = 5 * time.Second
	cfg.StatementTimeout = 3 * time.Second
	cfg.TTL = 10 * time.Second // room for the 3 s statement timeout in the lead
	_, _, stop := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Grace: 200 * time.Millisecond})
	<-started // the batch holds its locks while its query runs
	locks, _ := f.rdb.Keys(ctx, "lock:"+f.prefix+"*").Result()
	if len(locks) == 0 {
		t.Fatal("no lock held during the refresh: the test does not test anything")
	}
	stop()
	locks, _ = f.rdb.Keys(ctx, "lock:"+f.prefix+"*").Result()
	if len(locks) != 0 {
		t.Errorf("locks left after shutdown: %v", locks)
	}
}

func TestReconciliationAloneKeepsKeysWarm(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10)
	ctx := context.Background()
	// Keys written by an app with short TTLs, before the daemon knows them; notifications off.
	// 3 s: the daemon must learn them (PTTL) and refresh them one lead (1 s) before, with 2 s to spare for its
	// start-up on a busy machine.
	for _, id := range []string{"1", "2", "3"} {
		f.rdb.Set(ctx, f.key(id), "app", 3*time.Second)
	}
	cfg := f.config("1", "2", "3")
	w, reg, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Notifications: false})
	// An app rebuilds id 2 behind the daemon's back with a long TTL: reconciliation must learn it and not rebuild.
	// "Behind its back" means after the daemon learnt the short TTL: wait for that, not for a time.
	testenv.EventuallyDiag(t, 3*time.Second, "the daemon knows id 2's short TTL", func() (bool, string) {
		for _, st := range w.Status(0) {
			for _, k := range st.Keys {
				if k.ID == "2" {
					return k.TTL > 0 && k.TTL <= 3*time.Second, fmt.Sprintf("%+v", k)
				}
			}
		}
		return false, "id 2 not in the hot set"
	})
	f.rdb.Set(ctx, f.key("2"), "app-again", 30*time.Second)
	deadline := time.Now().Add(3 * cfg.TTL)
	for time.Now().Before(deadline) {
		if n, _ := f.rdb.Exists(ctx, f.key("1"), f.key("2"), f.key("3")).Result(); n != 3 {
			t.Fatal("a hot key expired with notifications off")
		}
		time.Sleep(25 * time.Millisecond)
	}
	if v, _ := f.rdb.Get(ctx, f.key("2")).Result(); v != "app-again" {
		t.Errorf("id 2 = %q: the daemon rebuilt a key an app had just written with a long TTL", v)
	}
	if got := counter(t, reg, "keepwarm_warmer_hot_expired_total", nil); got != 0 {
		t.Errorf("SLO counter = %v, want 0", got)
	}
}

func TestPersistentKeyNeverOverwritten(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	ctx := context.Background()
	f.rdb.Set(ctx, f.key("1"), "persistent", 0)
	cfg := f.config("1", "2")
	cfg.TopN = 0 // pinned-only: the polls leave the hot set and its gauges alone
	_, reg, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	testenv.Eventually(t, 3*time.Second, "persistent key reported", func() bool {
		return counter(t, reg, "keepwarm_warmer_keys_persistent", nil) == 1
	})
	// "Never overwritten" needs the daemon to have had its chance: wait (bounded) until id 2, pinned and written
	// at the same start, has been refreshed once more, so a whole refresh round and several reconciliation
	// passes have gone by with id 1 in the hot set. Only then is its value judged.
	testenv.Eventually(t, 10*time.Second, "id 2 refreshed a second time", func() bool { return f.src.count("2") >= 2 })
	if n := f.src.count("1"); n != 0 {
		t.Errorf("the persistent key's id was asked of the origin %d times, want 0", n)
	}
	if v, _ := f.rdb.Get(ctx, f.key("1")).Result(); v != "persistent" {
		t.Errorf("persistent key overwritten: %q", v)
	}
	if ttl, _ := f.rdb.PTTL(ctx, f.key("1")).Result(); ttl != -1 {
		t.Errorf("persistent key got a TTL: %v", ttl)
	}
	// An app gives the key a TTL again: it is no longer persistent, and the gauge says so (a pinned-only
	// keyspace's poll does not recompute the gauges, so the reading that learns the TTL must).
	f.rdb.Expire(ctx, f.key("1"), time.Minute)
	testenv.Eventually(t, 10*time.Second, "the gauge back at 0 once the key has a TTL", func() bool {
		return counter(t, reg, "keepwarm_warmer_keys_persistent", nil) == 0
	})
}

func TestMissingPolicies(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{warmer.MissingDelete, warmer.MissingKeep, warmer.MissingTombstone} {
		t.Run(policy, func(t *testing.T) {
			f := newFixture(t, 1)
			ctx := context.Background()
			f.rdb.Set(ctx, f.key("99"), "old", 800*time.Millisecond)
			cfg := f.config("99")
			cfg.Missing = policy
			cfg.Tombstone = []byte("null")
			cfg.TombstoneTTL = 5 * time.Second
			_, reg, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
			testenv.Eventually(t, 3*time.Second, "missing counted", func() bool {
				return counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"result": "missing"}) >= 1
			})
			v, err := f.rdb.Get(ctx, f.key("99")).Result()
			switch policy {
			case warmer.MissingDelete:
				if err != redis.Nil {
					t.Errorf("delete: value %q still there", v)
				}
			case warmer.MissingKeep:
				if v != "old" {
					t.Errorf("keep: value = %q, %v; want the old value", v, err)
				}
			case warmer.MissingTombstone:
				if v != "null" {
					t.Errorf("tombstone: value = %q, %v; want null", v, err)
				}
			}
			if n := f.src.count("99"); n > 2 {
				t.Errorf("missing id queried %d times in a few hundred ms: the daemon hammers the origin", n)
			}
		})
	}
}

func TestUpdatePinsAndUnpins(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10)
	ctx := context.Background()
	cfg := f.config("1")
	w, _, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	testenv.Eventually(t, 3*time.Second, "id 1 written", func() bool {
		n, _ := f.rdb.Exists(ctx, f.key("1")).Result()
		return n == 1
	})
	cfg.Pinned = []string{"5"}
	if err := w.Update([]warmer.KeyspaceConfig{cfg}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Second, "id 5 written after update", func() bool {
		n, _ := f.rdb.Exists(ctx, f.key("5")).Result()
		return n == 1
	})
	// Unpinned, id 1 is refreshed no more, so its key expires (at most ttl × (1 + jitter) after its last write);
	// while it was still refreshed, it would never be gone.
	before := f.src.count("1")
	testenv.Eventually(t, 2*cfg.TTL+time.Second, "unpinned id 1's key expired", func() bool {
		return f.rdb.Exists(ctx, f.key("1")).Val() == 0
	})
	if after := f.src.count("1"); after != before {
		t.Errorf("unpinned id 1 still refreshed (%d → %d queries)", before, after)
	}
	bad := cfg
	bad.TTL = 0
	if err := w.Update([]warmer.KeyspaceConfig{bad}); err == nil || !strings.Contains(err.Error(), "ttl") {
		t.Errorf("Update with ttl 0: err = %v, want an error naming ttl", err)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	keys, _ := lockstep.NewKeys("k:${id}", "", "", "")
	good := warmer.KeyspaceConfig{Name: "k", Keys: keys, Src: &countingSource{}, TTL: 10 * time.Second}
	tests := []struct {
		field string
		mut   func(c *warmer.KeyspaceConfig)
	}{
		{"name", func(c *warmer.KeyspaceConfig) { c.Name = "" }},
		{"ttl", func(c *warmer.KeyspaceConfig) { c.TTL = -1 }},
		{"jitter", func(c *warmer.KeyspaceConfig) { c.Jitter = 1.5 }},
		{"lock_ttl", func(c *warmer.KeyspaceConfig) { c.LockTTL = time.Second; c.StatementTimeout = 2 * time.Second }},
		{"refresh_ahead", func(c *warmer.KeyspaceConfig) { c.RefreshAhead = 6 * time.Second }},
		{"statement_timeout", func(c *warmer.KeyspaceConfig) {
			c.StatementTimeout = 4 * time.Second
			c.PoolWaitTimeout = 2 * time.Second
		}},
		{"missing", func(c *warmer.KeyspaceConfig) { c.Missing = "drop" }},
		{"tombstone_ttl", func(c *warmer.KeyspaceConfig) { c.Missing = warmer.MissingTombstone }},
		{"pinned", func(c *warmer.KeyspaceConfig) { c.Pinned = []string{""} }},
		{"keys", func(c *warmer.KeyspaceConfig) { c.Keys = nil }},
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	for _, tt := range tests {
		t.Run(tt.field, func(t *testing.T) {
			c := good
			tt.mut(&c)
			_, err := warmer.New(rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{c}})
			if err == nil || !strings.Contains(err.Error(), tt.field) {
				t.Errorf("err = %v, want one naming %q", err, tt.field)
			}
		})
	}
	if _, err := warmer.New(rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{good, good}}); err == nil ||
		!strings.Contains(err.Error(), "duplicate") {
		t.Errorf("duplicate names: err = %v", err)
	}
}

// TestTwoDaemonsNeverRebuildTwice runs two warmer replicas on the same keyspace: the token lock and the PTTL
// re-check under it must keep each key to one rebuild per TTL.
func TestTwoDaemonsNeverRebuildTwice(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 20)
	ids := []string{"1", "2", "3", "4", "5", "6", "7", "8"}
	cfg := f.config(ids...)
	// When each id was asked of the origin, by either replica (they share f.src).
	var mu sync.Mutex
	rebuilt := map[string][]time.Time{}
	f.src.before = func(batch []string) {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range batch {
			rebuilt[id] = append(rebuilt[id], time.Now())
		}
	}
	rdb2 := testenv.Redis(t)
	start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Seed: 1})
	start(t, rdb2, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Seed: 2})
	// Wait for the events, not for a time: every key written and then refreshed four times.
	const rounds = 5
	testenv.EventuallyDiag(t, 30*time.Second, fmt.Sprintf("every key rebuilt %d times", rounds), func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if len(rebuilt[id]) < rounds {
				return false, fmt.Sprintf("id %s rebuilt %d times", id, len(rebuilt[id]))
			}
		}
		return true, ""
	})
	// A key is rebuilt once per value: the next rebuild comes one TTL less the lead later (about 1.2 s here). Two
	// replicas both rebuilding a key would do so within a lock retry of each other (lead/8 plus a query), so two
	// rebuilds of one id less than ttl/4 apart are a double rebuild, however slow the machine.
	mu.Lock()
	for _, id := range ids {
		at := rebuilt[id]
		for i := 1; i < len(at); i++ {
			if gap := at[i].Sub(at[i-1]); gap < cfg.TTL/4 {
				t.Errorf("id %s rebuilt twice %v apart (rebuild %d of %d), want >= ttl/4 = %v: two replicas rebuilt one value",
					id, gap.Round(time.Millisecond), i+1, len(at), cfg.TTL/4)
			}
		}
	}
	mu.Unlock()
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = f.key(id)
	}
	if n, _ := f.rdb.Exists(context.Background(), keys...).Result(); n != int64(len(ids)) {
		t.Errorf("%d of %d hot keys present", n, len(ids))
	}
}

// TestDeadRedisKeepsRunning: with Redis unreachable the warmer neither panics nor exits; it keeps its loops
// going (progress advances) and stops cleanly.
func TestDeadRedisKeepsRunning(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { dead.Close() })
	w, _, stop := start(t, dead, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{f.config("1")}})
	first := w.Progress()
	testenv.Eventually(t, 10*time.Second, "scheduler progress with Redis down", func() bool { return w.Progress().After(first) })
	testenv.Eventually(t, 10*time.Second, "the pinned key listed as hot with Redis down", func() bool {
		st := w.Status(0)
		return len(st) == 1 && st[0].Hot == 1
	})
	stop()
}
