package lockstepprom_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/lockstep/lockstepprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestRecorder(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	rec, err := lockstepprom.New(reg)
	if err != nil {
		t.Fatalf("lockstepprom.New: %v", err)
	}
	rec.Hit("product")
	rec.Miss("product")
	rec.StaleServe("product")
	rec.LockContention("product")
	rec.EarlyRefresh("product")
	rec.Rebuild("product", 30*time.Millisecond, lockstep.ResultOK)
	rec.Wait("product", 120*time.Millisecond, lockstep.WaitStale)
	rec.NearHit("product")
	rec.NearBypass("product")
	rec.NearInvalidation("product")
	rec.NearBytes("product", 4096)

	problems, err := testutil.CollectAndLint(rec)
	if err != nil {
		t.Fatalf("CollectAndLint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("lint %s: %s", p.Metric, p.Text)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{
		"keepwarm_lockstep_hits_total": true, "keepwarm_lockstep_misses_total": true,
		"keepwarm_lockstep_stale_serves_total": true, "keepwarm_lockstep_lock_contentions_total": true,
		"keepwarm_lockstep_early_refreshes_total": true, "keepwarm_lockstep_rebuild_duration_seconds": true,
		"keepwarm_lockstep_wait_duration_seconds": true, "keepwarm_lockstep_near_hits_total": true,
		"keepwarm_lockstep_near_bypasses_total": true, "keepwarm_lockstep_near_invalidations_total": true,
		"keepwarm_lockstep_near_bytes": true,
	}
	for _, f := range families {
		if !want[f.GetName()] {
			t.Errorf("unexpected metric %s", f.GetName())
		}
		delete(want, f.GetName())
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() != "keyspace" && l.GetName() != "result" {
					t.Errorf("%s has label %q; only keyspace and result are allowed (never a key or an id)", f.GetName(), l.GetName())
				}
			}
		}
	}
	for name := range want {
		t.Errorf("metric %s missing", name)
	}

	if _, err := lockstepprom.New(reg); err == nil {
		t.Error("registering twice on one registry succeeded, want an error")
	}
	if _, err := lockstepprom.New(nil); !errors.Is(err, lockstep.ErrInvalidArgument) {
		t.Errorf("lockstepprom.New(nil) = %v, want lockstep.ErrInvalidArgument", err)
	}
}

func TestRecorderWithClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	reg := prometheus.NewRegistry()
	rec, err := lockstepprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := lockstep.NewKeys(testenv.Prefix(t, rdb)+"product:${id}", "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := lockstep.New(rdb, "product", keys, func(_ context.Context, id string) ([]byte, error) { return []byte(id), nil },
		time.Minute, lockstep.WithRecorder(rec), lockstep.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	for range 3 {
		if _, err := c.Get(ctx, "1"); err != nil {
			t.Fatal(err)
		}
	}
	const want = `
# HELP keepwarm_lockstep_hits_total Reads answered from the cache key on the first read.
# TYPE keepwarm_lockstep_hits_total counter
keepwarm_lockstep_hits_total{keyspace="product"} 2
# HELP keepwarm_lockstep_misses_total Reads that found no value on the first read.
# TYPE keepwarm_lockstep_misses_total counter
keepwarm_lockstep_misses_total{keyspace="product"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "keepwarm_lockstep_hits_total", "keepwarm_lockstep_misses_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(rec, "keepwarm_lockstep_rebuild_duration_seconds"); n != 1 {
		t.Errorf("rebuild histogram series = %d, want 1 (keyspace product, result ok)", n)
	}
}

// TestRecorderWithNearCache: a Client with a near cache finds the Recorder's NearRecorder methods and reports near
// hits and the bytes held.
func TestRecorderWithNearCache(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	reg := prometheus.NewRegistry()
	rec, err := lockstepprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := lockstep.NewKeys(testenv.Prefix(t, rdb)+"product:${id}", "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := lockstep.New(rdb, "product", keys, func(_ context.Context, id string) ([]byte, error) { return []byte(id), nil },
		time.Minute, lockstep.WithRecorder(rec), lockstep.WithLogger(slog.New(slog.DiscardHandler)),
		lockstep.WithNearCache(lockstep.NearCache{MaxBytes: 1 << 20, MaxStaleness: time.Minute, MaxLag: 50 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	testenv.Eventually(t, 5*time.Second, "near hits and bytes reported", func() bool {
		if _, err := c.Get(ctx, "1"); err != nil {
			t.Fatal(err)
		}
		return gathered(t, reg, "keepwarm_lockstep_near_hits_total") > 0 && gathered(t, reg, "keepwarm_lockstep_near_bytes") > 0
	})
}

// gathered is the value of the one series of the metric name in reg (a counter or a gauge), or 0.
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name || len(f.GetMetric()) == 0 {
			continue
		}
		m := f.GetMetric()[0]
		if c := m.GetCounter(); c != nil {
			return c.GetValue()
		}
		return m.GetGauge().GetValue()
	}
	return 0
}
