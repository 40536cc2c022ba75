package warmer_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/warmer"
)

// The hot set follows reality. These run against the real Redis, with the warmer's
// clock injected (real time plus an offset the test can move), so that hours of decay take no time.

// offsetClock is the real clock whose Now is moved by an offset the test advances; its timers run in real time.
type offsetClock struct {
	clockwork.Clock
	off atomic.Int64
}

func newOffsetClock() *offsetClock { return &offsetClock{Clock: clockwork.NewRealClock()} }

func (c *offsetClock) Now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *offsetClock) advance(d time.Duration) { c.off.Add(int64(d)) }

// reader stands for the apps' access recording: it adds 1 to each id's access score every 20 ms until stopped.
func reader(t *testing.T, f *fixture, accessKey string, ids ...string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			pipe := f.rdb.Pipeline()
			for _, id := range ids {
				pipe.ZIncrBy(ctx, accessKey, 1, id)
			}
			_, _ = pipe.Exec(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

func hotSet(w *warmer.Warmer) []string {
	var ids []string
	for _, st := range w.Status(0) {
		for _, k := range st.Keys {
			ids = append(ids, k.ID)
		}
	}
	slices.Sort(ids)
	return ids
}

func TestHotSetShrinksWhenTheAccessSetIsLost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		minScore float64
		advance  time.Duration // how far the clock jumps after the access set is lost
		within   time.Duration
	}{
		// The daemon's default min_score 1: the in-memory scores fade below it on their own (here 30 half-lives of
		// the access scores, and 10 of the long memory, whose counts saturate at 255 = 2^8 - 1: both reach 0).
		{"scores fade below min_score", 1, 30 * time.Minute, 3 * time.Second},
		// min_score 0: the refresh feedback finds every refresh unread and demotes the keys.
		{"unread refreshes demote", 0, 0, 15 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, 10)
			ctx := context.Background()
			cfg := f.config()
			cfg.TopN, cfg.MinScore, cfg.DecayHalfLife, cfg.HistoryHalfLife = 5, tc.minScore, time.Minute, 3*time.Minute
			clock := newOffsetClock()
			stopReads := reader(t, f, cfg.AccessKey, "1", "2", "3")
			w, reg, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Clock: clock})
			testenv.Eventually(t, 5*time.Second, "ids 1, 2, 3 hot and written", func() bool {
				n, _ := f.rdb.Exists(ctx, f.key("1"), f.key("2"), f.key("3")).Result()
				return n == 3 && slices.Equal(hotSet(w), []string{"1", "2", "3"})
			})
			// Read keys keep their slots: two more refreshes each, all read, none demoted.
			before := f.src.count("1")
			testenv.Eventually(t, 5*time.Second, "two more refreshes of a read key", func() bool { return f.src.count("1") >= before+2 })
			if got := hotSet(w); !slices.Equal(got, []string{"1", "2", "3"}) {
				t.Fatalf("hot = %v while read, want [1 2 3]", got)
			}
			// The access set is lost (FLUSHALL, or eviction: here only this test's key) and nobody reads any more.
			stopReads()
			if err := f.rdb.Del(ctx, cfg.AccessKey).Err(); err != nil {
				t.Fatal(err)
			}
			clock.advance(tc.advance)
			testenv.Eventually(t, tc.within, "hot set empty", func() bool { return len(hotSet(w)) == 0 })
			f.src.mu.Lock()
			queries := f.src.queries
			f.src.mu.Unlock()
			wasted := counter(t, reg, "keepwarm_warmer_refreshes_wasted_total", nil)
			t.Logf("refreshes judged %v, wasted %v, ratio %v", counter(t, reg, "keepwarm_warmer_refreshes_judged_total", nil),
				wasted, counter(t, reg, "keepwarm_warmer_wasted_refresh_ratio", nil))
			if tc.minScore == 0 && wasted < 3 {
				t.Errorf("wasted refreshes = %v, want >= 3 (each key demoted after unread refreshes)", wasted)
			}
			// And it stays empty: no more origin queries for a few refresh periods.
			if testenv.Poll(3*cfg.TTL, func() bool { return len(hotSet(w)) != 0 }) {
				t.Errorf("hot set refilled without any reads: %v", hotSet(w))
			}
			f.src.mu.Lock()
			after := f.src.queries
			f.src.mu.Unlock()
			if after > queries+1 { // at most one batch already in flight
				t.Errorf("origin queries went on after the hot set emptied: %d → %d", queries, after)
			}
		})
	}
}

// failingSource fails every query, like a PostgreSQL that is down.
type failingSource struct{}

func (failingSource) Fetch(context.Context, []string) (map[string][]byte, []string, error) {
	return nil, nil, errors.New("connection refused")
}

func TestOutageFreezesHotSet(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10)
	ctx := context.Background()
	sw := &switchSource{up: f.src, down: failingSource{}}
	cfg := f.config()
	cfg.Src = sw
	cfg.TopN, cfg.DecayHalfLife, cfg.MaxStale = 2, time.Minute, time.Hour
	cfg.TTL, cfg.RefreshAhead = 4*time.Second, 2*time.Second // room for the fail-safe on a loaded machine (as TestFailSafeKeepsHotKeysReadable)
	clock := newOffsetClock()
	reader(t, f, cfg.AccessKey, "1", "1", "2") // 1 is read twice as often as 2, the key at the cut-off
	w, reg, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Clock: clock})
	testenv.Eventually(t, 5*time.Second, "ids 1 and 2 hot and written", func() bool {
		n, _ := f.rdb.Exists(ctx, f.key("1"), f.key("2")).Result()
		return n == 2 && slices.Equal(hotSet(w), []string{"1", "2"})
	})
	sw.isDown.Store(true)
	testenv.Eventually(t, 5*time.Second, "fail-safe extending the hot values", func() bool {
		return counter(t, reg, "keepwarm_warmer_failsafe_extensions_total", nil) >= 2
	})
	// During the outage id 3 becomes far more read than id 2, the key at the top_n cut-off.
	reader(t, f, cfg.AccessKey, "3", "3", "3")
	f.rdb.ZIncrBy(ctx, cfg.AccessKey, 1000, "3")
	// For several TTLs (many polls) the hot set stays as it was, and key 2 stays readable.
	deadline := time.Now().Add(3 * cfg.TTL)
	for time.Now().Before(deadline) {
		if got := hotSet(w); !slices.Equal(got, []string{"1", "2"}) {
			t.Fatalf("hot = %v during the origin outage, want it frozen at [1 2]", got)
		}
		if n, _ := f.rdb.Exists(ctx, f.key("2")).Result(); n != 1 {
			t.Fatal("key 2 expired during the outage: it dropped out of the hot set and lost the fail-safe")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// (The SLO counter is the fail-safe's business, tested in TestFailSafeKeepsHotKeysReadable; here it is logged.)
	t.Logf("hot keys expired during the outage: %v", counter(t, reg, "keepwarm_warmer_hot_expired_total", nil))
	// The origin is back; once the outage has settled (30 s without failures, on the injected clock), the
	// selection follows the reads again: 3 displaces 2.
	sw.isDown.Store(false)
	ok := counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"result": "ok"})
	testenv.Eventually(t, 5*time.Second, "a refresh succeeds after the outage", func() bool {
		return counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"result": "ok"}) > ok
	})
	clock.advance(31 * time.Second)
	testenv.Eventually(t, 5*time.Second, "3 displaces 2 after the outage", func() bool {
		return slices.Equal(hotSet(w), []string{"1", "3"})
	})
}
