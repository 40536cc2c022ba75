package clustertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/sources/postgres"
	"github.com/keepwarm/keepwarm/warmer"
)

// fixture is one test's origin table (id, v: a version the test bumps), key layout and source.
type fixture struct {
	rdb   redis.UniversalClient
	pool  *pgxpool.Pool
	table string
	keys  *lockstep.Keys
	src   warmer.Source
	ids   []string
}

// newFixture makes a table of rows ids "1".."rows" with version 1, and the layout cache (a template with ${id}).
func newFixture(t *testing.T, rdb redis.UniversalClient, rows int, cache string) *fixture {
	t.Helper()
	f := &fixture{rdb: rdb, pool: testenv.Postgres(t)}
	f.table = pgx.Identifier{testenv.Schema(t, f.pool), "items"}.Sanitize()
	ctx := context.Background()
	if _, err := f.pool.Exec(ctx, "create table "+f.table+" (id text primary key, v bigint not null)"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(ctx, "insert into "+f.table+" select i::text, 1 from generate_series(1, $1) i", rows); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= rows; i++ {
		f.ids = append(f.ids, strconv.Itoa(i))
	}
	var err error
	if f.keys, err = lockstep.NewKeys(cache, "", "", ""); err != nil {
		t.Fatal(err)
	}
	if _, ok := rdb.(*redis.ClusterClient); ok {
		if err := f.keys.CheckCluster(); err != nil {
			t.Fatal(err)
		}
	}
	f.src, err = postgres.New(f.pool, postgres.Config{Keyspace: "items", StatementTimeout: 5 * time.Second,
		Query: "select id, json_build_object('id', id, 'v', v)::text from " + f.table + " where id = any($1)"})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// config is the keyspace: every id pinned (hot), TTL ttl, refreshed lead before expiry, reconciled often.
func (f *fixture) config(ttl, lead time.Duration) warmer.KeyspaceConfig {
	return warmer.KeyspaceConfig{
		Name: "items", Keys: f.keys, Src: f.src, TTL: ttl, Jitter: 0.1, RefreshAhead: lead, LockTTL: 2 * time.Second,
		StatementTimeout: time.Second, BatchSize: 50, MaxOriginConcurrency: 4, TopN: 0, Pinned: f.ids,
		AccessKey:    "{" + f.keys.Cache.String() + "}access",
		PollInterval: 200 * time.Millisecond, ReconcileEvery: time.Second,
	}
}

// bumpEvery raises every row's version every d until the test ends, so that a value published late with a stale
// token would show as a version going backwards.
func (f *fixture) bumpEvery(t *testing.T, d time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(d)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
				_, _ = f.pool.Exec(ctx, "update "+f.table+" set v = v + 1")
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// daemon is a running warmer with its registry and log.
type daemon struct {
	w    *warmer.Warmer
	reg  *prometheus.Registry
	logs *testenv.LogBuffer
}

// startDaemon runs a warmer on rdb with notifications = "auto" until the test ends.
func startDaemon(t *testing.T, rdb redis.UniversalClient, ks warmer.KeyspaceConfig) *daemon {
	t.Helper()
	d := &daemon{reg: prometheus.NewRegistry(), logs: &testenv.LogBuffer{}}
	var err error
	d.w, err = warmer.New(rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{ks}, Registerer: d.reg,
		Notifications: true, AutoNotifyFlags: true, NodeCheckInterval: 300 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(d.logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("Run did not return 20 s after cancel")
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.logs.String())
		}
	})
	return d
}

// metric sums the samples of a counter or gauge whose labels include labels (testenv.MetricSum).
func (d *daemon) metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	return testenv.MetricSum(t, d.reg, name, labels)
}

func (d *daemon) refreshed(t *testing.T) float64 {
	return d.metric(t, "keepwarm_warmer_refreshes_total", map[string]string{"result": warmer.ResultOK})
}

// slo checks the SLO counter and the vanished counter: no hot key expired before its refresh, and none was
// deleted or evicted (nothing in these tests deletes: a MIGRATE or a failover must not look like a deletion).
func (d *daemon) slo(t *testing.T) {
	t.Helper()
	if got := d.metric(t, "keepwarm_warmer_hot_expired_total", nil); got != 0 {
		t.Errorf("keepwarm_warmer_hot_expired_total: got %v, want 0", got)
	}
	if got := d.metric(t, "keepwarm_warmer_hot_vanished_total", nil); got != 0 {
		t.Errorf("keepwarm_warmer_hot_vanished_total: got %v, want 0", got)
	}
}

// readers is app load through lockstep clients, one per goroutine (each its own process), with a check that no
// key's version ever goes backwards.
type readers struct {
	hits, misses, errs atomic.Int64
	loads              atomic.Int64
	regressions        atomic.Int64 // a key read with a lower version than before: a late, stale publish
	window             atomic.Bool  // while set, regressions are counted in windowRegressions instead
	windowRegressions  atomic.Int64
	mu                 sync.Mutex
	firstErr           error
}

type recorder struct{ r *readers }

func (c recorder) Hit(string)                            { c.r.hits.Add(1) }
func (c recorder) Miss(string)                           { c.r.misses.Add(1) }
func (c recorder) StaleServe(string)                     {}
func (c recorder) Rebuild(string, time.Duration, string) {}
func (c recorder) LockContention(string)                 {}
func (c recorder) Wait(string, time.Duration, string)    {}
func (c recorder) EarlyRefresh(string)                   {}

// startReaders runs n readers that each read every id in turn, one Get per pace, until the test ends.
func (f *fixture) startReaders(t *testing.T, n int, ttl, pace time.Duration) *readers {
	t.Helper()
	r := &readers{}
	load := func(ctx context.Context, id string) ([]byte, error) {
		r.loads.Add(1)
		var v string
		err := f.pool.QueryRow(ctx, "select json_build_object('id', id, 'v', v)::text from "+f.table+" where id = $1", id).Scan(&v)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, lockstep.ErrNotFound
		}
		return []byte(v), err
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		c, err := lockstep.New(f.rdb, "items", f.keys, load, ttl, lockstep.WithJitter(0.1), lockstep.WithRecorder(recorder{r}))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close(context.Background())
			seen := map[string]int64{}
			tk := time.NewTicker(pace)
			defer tk.Stop()
			for j := i; ; j++ {
				select {
				case <-ctx.Done():
					return
				case <-tk.C:
				}
				id := f.ids[j%len(f.ids)]
				b, err := c.Get(ctx, id)
				if err != nil {
					if ctx.Err() == nil {
						r.errs.Add(1)
						r.mu.Lock()
						if r.firstErr == nil {
							r.firstErr = fmt.Errorf("get %s: %w", id, err)
						}
						r.mu.Unlock()
					}
					continue
				}
				var v struct {
					V int64 `json:"v"`
				}
				if err := json.Unmarshal(b, &v); err != nil {
					r.errs.Add(1)
					continue
				}
				if v.V < seen[id] {
					if r.window.Load() {
						r.windowRegressions.Add(1)
					} else {
						r.regressions.Add(1)
					}
				}
				seen[id] = max(seen[id], v.V)
			}
		}()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return r
}

func (r *readers) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprintf("hits %d, misses %d (app loads %d), errors %d (first: %v), version regressions %d (+%d in the failover window)",
		r.hits.Load(), r.misses.Load(), r.loads.Load(), r.errs.Load(), r.firstErr, r.regressions.Load(), r.windowRegressions.Load())
}
