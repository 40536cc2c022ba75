package warmer_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
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
	admin, rdb, cfg := accessSetSetup(t)
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

// TestLostAccessScoresWrittenBack: after the access set is lost (here deleted; a Redis restart or a flush does
// the same) apps record reads from 0 again, and a second's reads rank ids at random. The daemon reads each score
// that fell further than decay explains as a loss: the hot set stays what it was, and the remembered scores are
// written back to the access set (ZADD GT), counted and logged, so that every replica reads them again.
func TestLostAccessScoresWrittenBack(t *testing.T) {
	t.Parallel()
	admin, rdb, cfg := accessSetSetup(t)
	ctx := context.Background()
	for i := 1; i <= 10; i++ {
		score := 20.0 // cold
		if i <= 5 {
			score = 100 // hot
		}
		// Two readings that rise, so that each id is admitted (the doorkeeper wants reads in two polls).
		admin.ZAdd(ctx, cfg.AccessKey, redis.Z{Score: score / 2, Member: strconv.Itoa(i)})
	}
	logs := &testenv.LogBuffer{}
	w, reg, _ := start(t, rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg},
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	hot := func() string {
		var ids []string
		for _, st := range w.Status(100) {
			for _, k := range st.Keys {
				ids = append(ids, k.ID)
			}
		}
		slices.Sort(ids)
		return strings.Join(ids, ",")
	}
	p0 := w.Progress()
	testenv.Eventually(t, 10*time.Second, "a poll after the first", func() bool {
		return w.Progress().After(p0.Add(2 * cfg.PollInterval))
	})
	// One transaction: a poll sees every id's rise or none. Sent one by one, a poll that ran between them saw ids
	// 1–5 rise (and made them hot) but remembered 6–10 from before their rise, one below what "before" reads.
	if _, err := admin.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i := 1; i <= 10; i++ {
			p.ZIncrBy(ctx, cfg.AccessKey, 1, strconv.Itoa(i))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := "1,2,3,4,5"
	testenv.EventuallyDiag(t, 10*time.Second, "the five hottest hot", func() (bool, string) { h := hot(); return h == want, h })
	// And a poll that read the rise: ids 1–5 can be hot before it (admitted on their first readings), and a daemon
	// that never read 6–10 after their rise remembers them one below what "before" reads (CI saw 9.33 for 10.33).
	p1 := w.Progress()
	testenv.Eventually(t, 10*time.Second, "a poll after the rise", func() bool {
		return w.Progress().After(p1.Add(2 * cfg.PollInterval))
	})
	// The loss, and a second of reads after it: the cold ids read more than the hot ones.
	before := map[int]float64{}
	for i := 1; i <= 10; i++ {
		before[i] = admin.ZScore(ctx, cfg.AccessKey, strconv.Itoa(i)).Val()
	}
	// The loss and the reads after it in one transaction, so that every poll sees either the set before or after.
	if _, err := admin.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, cfg.AccessKey)
		for i := 1; i <= 10; i++ {
			n := 1.0
			if i > 5 {
				n = 3
			}
			p.ZAdd(ctx, cfg.AccessKey, redis.Z{Score: n, Member: strconv.Itoa(i)})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	restored := func() float64 { return counter(t, reg, "keepwarm_warmer_access_scores_restored_total", nil) }
	testenv.EventuallyDiag(t, 5*time.Second, "the ten fallen scores written back", func() (bool, string) {
		return restored() == 10, fmt.Sprint(restored())
	})
	for i := 1; i <= 10; i++ {
		// What the daemon remembered: within one of the access set's decay steps (0.93 at the default
		// 10-minute half-life) of what the set held just before the loss, either way (a step may have run after
		// the daemon's last reading, or between the loss and the write-back).
		s := admin.ZScore(ctx, cfg.AccessKey, strconv.Itoa(i)).Val()
		if s < before[i]*0.92 || s > before[i]/0.92 {
			t.Errorf("id %d's access score after the write-back = %.2f, want the %.2f it had before the loss (decayed a little)", i, s, before[i])
		}
	}
	if n := logs.Count("access scores fell further than decay explains"); n != 1 {
		t.Errorf("%d log lines of the write-back, want 1", n)
	}
	// Five more polls: the hot set is what it was, and nothing more is written back.
	p2 := w.Progress()
	testenv.Eventually(t, 10*time.Second, "five more poll intervals", func() bool {
		return w.Progress().After(p2.Add(5 * cfg.PollInterval))
	})
	if h := hot(); h != want {
		t.Errorf("hot set after the loss = %s, want %s", h, want)
	}
	if n := restored(); n != 10 {
		t.Errorf("%v scores written back, want 10 (once each)", n)
	}
}

// accessSetSetup is reconcileSetup for the access-set tests: top_n 5, min_score 0, a poll every 100 ms, and the
// access set of keyspace "rc".
func accessSetSetup(t *testing.T) (admin, rdb *redis.Client, cfg warmer.KeyspaceConfig) {
	t.Helper()
	admin, rdb, cfg, _ = reconcileSetup(t, 0, time.Minute)
	cfg.TopN, cfg.MinScore, cfg.PollInterval = 5, 0, 100*time.Millisecond
	cfg.AccessKey = lockstep.AccessKey("rc")
	return admin, rdb, cfg
}
