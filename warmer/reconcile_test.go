package warmer_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/warmer"
)

// memSource serves the same small value for every id, so that these tests measure Redis traffic, not PostgreSQL.
type memSource struct{ rows atomic.Int64 }

func (m *memSource) Fetch(_ context.Context, ids []string) (map[string][]byte, []string, error) {
	out := make(map[string][]byte, len(ids))
	for _, id := range ids {
		out[id] = []byte(`{"id":"` + id + `"}`)
	}
	m.rows.Add(int64(len(ids)))
	return out, nil, nil
}

// canaryApart names the flush canary's SET "canary", so that it is not counted as a lock's SET.
func canaryApart(cmd redis.Cmder) string {
	if k, ok := cmd.Args()[min(1, len(cmd.Args())-1)].(string); ok && strings.HasPrefix(k, "keepwarm:canary:") {
		return "canary"
	}
	return testenv.CommandName(cmd)
}

// reconcileSetup starts a private Redis (so that CONFIG SET and CLIENT KILL touch nobody else) with keyspace
// notifications on, and a keyspace of n pinned ids with an in-memory source.
func reconcileSetup(t *testing.T, n int, ttl time.Duration) (admin, rdb *redis.Client, cfg warmer.KeyspaceConfig, hook *testenv.Commands) {
	t.Helper()
	admin = testenv.PrivateRedis(t)
	setConfig(t, admin, "notify-keyspace-events", "Exeg$")
	rdb = redis.NewClient(admin.Options())
	t.Cleanup(func() { rdb.Close() })
	hook = testenv.CountCommandsBy(rdb, canaryApart)
	keys, err := lockstep.NewKeys("rc:${id}", "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	pinned := make([]string, n)
	for i := range pinned {
		pinned[i] = strconv.Itoa(i)
	}
	cfg = warmer.KeyspaceConfig{Name: "rc", Keys: keys, Src: &memSource{}, TTL: ttl, Jitter: 0.1, Pinned: pinned,
		ReconcileEvery: 300 * time.Millisecond, ReconcileTrustedEvery: time.Hour,
		LockTTL: 500 * time.Millisecond, StatementTimeout: 200 * time.Millisecond}
	return admin, rdb, cfg, hook
}

// TestTrustedRefreshCostsTwoCommands: with notifications healthy, a key the daemon wrote itself is neither
// re-checked by the reconciliation nor re-read under the lock: each refresh is one SET NX and one publish script,
// although reconcile_every (300 ms) is far shorter than the TTL.
func TestTrustedRefreshCostsTwoCommands(t *testing.T) {
	t.Parallel()
	_, rdb, cfg, hook := reconcileSetup(t, 20, 2*time.Second)
	_, reg, _ := start(t, rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Notifications: true})
	ok := func() float64 {
		return counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"result": warmer.ResultOK})
	}
	// First writes, then one full round of refreshes of the daemon's own writes (trusted by then).
	testenv.Eventually(t, 10*time.Second, "first refresh round", func() bool { return ok() >= 40 })
	hook.Reset()
	ok0 := ok()
	testenv.Eventually(t, 15*time.Second, "two more refresh rounds", func() bool { return ok() >= ok0+40 })
	refreshes := ok() - ok0
	if got := hook.Count("pttl"); float64(got) > 0.05*refreshes {
		t.Errorf("%d PTTLs for %.0f refreshes of trusted keys, want (almost) none", got, refreshes)
	}
	sent := hook.Count("set") + hook.Count("evalsha") + hook.Count("pttl")
	if per := float64(sent) / refreshes; per > 2.1 {
		t.Errorf("%.2f commands (SET NX, PTTL, EVALSHA) per refresh, want <= 2.1 (counts %v)", per, hook.Counts())
	}
}

// TestLostNotificationsMakeKeysUntrusted: when the subscription is lost and Redis comes back with notifications
// off (as after a restart), every hot key is re-checked at reconcile_every again, and re-read under the lock.
func TestLostNotificationsMakeKeysUntrusted(t *testing.T) {
	t.Parallel()
	admin, rdb, cfg, hook := reconcileSetup(t, 20, 2*time.Second)
	_, reg, _ := start(t, rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Notifications: true})
	ok := func() float64 {
		return counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"result": warmer.ResultOK})
	}
	checks := func() float64 { return counter(t, reg, "keepwarm_warmer_reconcile_checks_total", nil) }
	testenv.Eventually(t, 10*time.Second, "first refresh round", func() bool { return ok() >= 40 })
	ctx := context.Background()
	setConfig(t, admin, "notify-keyspace-events", "")
	if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	c0 := checks()
	// 20 untrusted keys, each re-checked every 150–300 ms: 40 checks take well under a second once they start.
	testenv.Eventually(t, 10*time.Second, "untrusted keys re-checked by the reconciliation", func() bool { return checks() >= c0+40 })
	hook.Reset()
	ok0 := ok()
	testenv.Eventually(t, 10*time.Second, "a refresh round", func() bool { return ok() >= ok0+20 })
	if got, refreshes := hook.Count("pttl"), ok()-ok0; float64(got) < refreshes {
		t.Errorf("%d PTTLs for %.0f refreshes with notifications off, want at least one per refresh (the re-check under the lock)", got, refreshes)
	}
}

// TestReconcileBudget: the reconciliation sends at most reconcile_budget PTTLs per second, in small pipelines
// spread over time rather than one burst per interval, and reports the lag when the hot set needs more.
func TestReconcileBudget(t *testing.T) {
	t.Parallel()
	_, rdb, cfg, hook := reconcileSetup(t, 400, time.Hour)
	cfg.ReconcileEvery = time.Second // 400 keys per second needed
	cfg.ReconcileBudget = 100        // 100 per second allowed: 10 per 100 ms tick
	logs := &testenv.LogBuffer{}
	_, reg, _ := start(t, rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	checks := func() float64 { return counter(t, reg, "keepwarm_warmer_reconcile_checks_total", nil) }
	testenv.Eventually(t, 10*time.Second, "reconciliation running", func() bool { return checks() >= 50 })
	hook.Reset()
	c0, t0 := checks(), time.Now()
	testenv.Eventually(t, 10*time.Second, "200 more checks", func() bool { return checks() >= c0+200 })
	elapsed := time.Since(t0)
	n := checks() - c0
	if limit := 100*elapsed.Seconds() + 20; n > limit {
		t.Errorf("%.0f checks in %v, want at most %.0f (budget 100/s plus two ticks)", n, elapsed, limit)
	}
	maxPipe := hook.MostInOneTrip("pttl")
	if maxPipe > 10 {
		t.Errorf("largest PTTL pipeline %d, want <= 10 (budget × tick)", maxPipe)
	}
	testenv.Eventually(t, 5*time.Second, "lag reported", func() bool {
		return counter(t, reg, "keepwarm_warmer_reconcile_lag_seconds", nil) > 1 &&
			logs.Count("reconciliation is behind") == 1
	})
}
