package warmer_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/warmer"
)

// TestEvictionsReported: under memory pressure (maxmemory reached, allkeys-random) Redis evicts hot values; the
// daemon counts the evictions it is notified of, and reports one episode of hot values vanishing in bulk, in a
// metric and one log line.
func TestEvictionsReported(t *testing.T) {
	t.Parallel()
	admin, rdb, cfg, _ := reconcileSetup(t, 300, time.Minute)
	logs := &testenv.LogBuffer{}
	_, reg, _ := start(t, rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Notifications: true,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	ok := func() float64 {
		return counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"result": warmer.ResultOK})
	}
	testenv.Eventually(t, 15*time.Second, "300 hot keys written", func() bool { return ok() >= 300 })
	ctx := context.Background()
	used := memoryUsed(t, admin)
	setConfig(t, admin, "maxmemory-policy", "allkeys-random")
	setConfig(t, admin, "maxmemory", strconv.FormatInt(used+512<<10, 10))
	junk := strings.Repeat("j", 1024)
	for i := 0; i < 4096; i++ { // 4 MiB of junk against 512 KiB of headroom: most keys go, hot values among them
		if err := admin.Set(ctx, "junk:"+strconv.Itoa(i), junk, 0).Err(); err != nil && !strings.Contains(err.Error(), "OOM") {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 10*time.Second, "evictions counted and the bulk episode reported", func() bool {
		return counter(t, reg, "keepwarm_warmer_hot_evicted_total", nil) >= 10 &&
			counter(t, reg, "keepwarm_warmer_hot_vanished_bulk_total", nil) == 1 &&
			logs.Count("hot values are vanishing in bulk") == 1
	})
}

// TestAccessSetLost: an access set that had members and is then gone (evicted, or deleted) is reported once, in a
// metric and a log line; a set that is merely cold is not.
func TestAccessSetLost(t *testing.T) {
	t.Parallel()
	admin, rdb, cfg, _ := reconcileSetup(t, 0, time.Minute)
	cfg.TopN, cfg.MinScore, cfg.PollInterval = 5, 0, 100*time.Millisecond
	cfg.AccessKey = lockstep.AccessKey("rc")
	ctx := context.Background()
	for i := 1; i <= 5; i++ {
		admin.ZAdd(ctx, cfg.AccessKey, redis.Z{Score: 10, Member: strconv.Itoa(i)})
	}
	logs := &testenv.LogBuffer{}
	w, reg, _ := start(t, rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg},
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	testenv.Eventually(t, 10*time.Second, "hot keys written", func() bool {
		return counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"result": warmer.ResultOK}) >= 5
	})
	lost := func() float64 { return counter(t, reg, "keepwarm_warmer_access_set_lost_total", nil) }
	if n := lost(); n != 0 {
		t.Fatalf("access set reported lost %v times while it is there", n)
	}
	admin.Del(ctx, cfg.AccessKey)
	testenv.Eventually(t, 5*time.Second, "loss reported", func() bool {
		return lost() == 1 && logs.Count("the access set is gone") == 1
	})
	// It stays gone: still one report, not one per poll (the scheduler runs on through five more poll intervals).
	p0 := w.Progress()
	testenv.Eventually(t, 10*time.Second, "five more poll intervals of scheduler progress", func() bool {
		return w.Progress().After(p0.Add(5 * cfg.PollInterval))
	})
	if n := lost(); n != 1 {
		t.Errorf("access set reported lost %v times, want 1", n)
	}
}

func memoryUsed(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatal("no used_memory in INFO memory")
	return 0
}
