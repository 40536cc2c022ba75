package warmer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/warmer"
)

// oomLine is the start of the one line the warmer logs per episode of Redis refusing new keys.
const oomLine = "redis refuses new keys"

// absenceWatch polls keys from outside the daemon, with its own client, until stopped, and records every reading
// that found one of them absent (or without TTL, which the daemon never writes).
type absenceWatch struct {
	stop  chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	gaps  []string // "key: PTTL -2 at <time>"
	polls int
}

func watchAbsence(t *testing.T, c *redis.Client, keys []string) *absenceWatch {
	t.Helper()
	a := &absenceWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(a.done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		ctx := context.Background()
		for {
			cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range keys {
					p.PTTL(ctx, k)
				}
				return nil
			})
			a.mu.Lock()
			if err == nil {
				a.polls++
				for i, cmd := range cmds {
					if d := cmd.(*redis.DurationCmd).Val(); d < 0 { // go-redis keeps PTTL's -2 (gone) and -1 (no TTL) as is
						a.gaps = append(a.gaps, fmt.Sprintf("%s: PTTL %d at %s", keys[i], int64(d), time.Now().Format("15:04:05.000")))
					}
				}
			}
			a.mu.Unlock()
			select {
			case <-a.stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(a.end)
	return a
}

// end stops the watch (once; later calls return at once).
func (a *absenceWatch) end() {
	select {
	case <-a.stop:
	default:
		close(a.stop)
	}
	<-a.done
}

// result returns the absences seen so far and the number of polls made.
func (a *absenceWatch) result() (gaps []string, polls int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.gaps...), a.polls
}

// TestOOMKeepsHotKeysAlive: hot keys on a private Redis, origin healthy; then Redis reaches maxmemory with
// noeviction and refuses every new key, the daemon's locks included. The daemon extends the hot values without a
// lock (mode="unlocked" on the fail-safe counter), so that over many TTLs no hot key is ever absent to an outside
// poller; it logs why once for the episode, not per batch; WritesRefused names the OOM. Once memory is freed,
// refreshes under the lock resume, WritesRefused is nil again, and the flush canary, which outlived its TTL
// under OOM, reports no flush.
func TestOOMKeepsHotKeysAlive(t *testing.T) {
	t.Parallel()
	admin := testenv.PrivateRedis(t)
	rdb := redis.NewClient(admin.Options())
	t.Cleanup(func() { rdb.Close() })
	obs := redis.NewClient(admin.Options())
	t.Cleanup(func() { obs.Close() })
	keys, err := lockstep.NewKeys("oom:${id}", "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	pinned := make([]string, n)
	cacheKeys := make([]string, n)
	for i := range pinned {
		pinned[i] = strconv.Itoa(i)
		cacheKeys[i] = "oom:" + pinned[i]
	}
	cfg := warmer.KeyspaceConfig{Name: "oom", Keys: keys, Src: &memSource{}, TTL: 2 * time.Second, Jitter: 0.1,
		Pinned: pinned, RefreshAhead: 600 * time.Millisecond, LockTTL: 500 * time.Millisecond,
		StatementTimeout: 200 * time.Millisecond, MaxStale: time.Minute}
	logs := &testenv.LogBuffer{}
	w, reg, _ := start(t, rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg},
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	ok := func() float64 {
		return counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"result": warmer.ResultOK})
	}
	unlocked := func() float64 {
		return counter(t, reg, "keepwarm_warmer_failsafe_extensions_total", map[string]string{"mode": warmer.FailSafeUnlocked})
	}
	missed := func() float64 { return counter(t, reg, "keepwarm_warmer_hot_expired_total", nil) }
	testenv.Eventually(t, 15*time.Second, "hot keys written and refreshed once", func() bool { return ok() >= 2*n })
	if err := w.WritesRefused(); err != nil {
		t.Fatalf("WritesRefused before the OOM = %v, want nil", err)
	}
	watch := watchAbsence(t, obs, cacheKeys)

	junk := testenv.FillToOOM(t, admin)
	oomAt, err := admin.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Longer than the flush canary's TTL (so that the canary, which Redis will not rewrite, must be kept alive too)
	// and than three TTLs, by Redis's clock, through which every hot key was extended without a lock at least
	// three times; or until a hot key is found absent, whichever comes first.
	oomFor := max(3*cfg.TTL, warmer.CanaryTTL+time.Second)
	testenv.EventuallyDiag(t, oomFor+60*time.Second, "OOM outlasting the canary with each hot key extended three times, or a hot key absent", func() (bool, string) {
		now, err := admin.Time(context.Background()).Result()
		if err != nil {
			return false, err.Error()
		}
		gaps, _ := watch.result()
		return len(gaps) > 0 || (now.Sub(oomAt) > oomFor && unlocked() >= 3*n),
			fmt.Sprintf("%v of OOM, %v extensions without lock, %v refreshes ok\n%s", now.Sub(oomAt), unlocked(), ok(), logs)
	})
	if gaps, polls := watch.result(); len(gaps) > 0 {
		t.Fatalf("hot keys absent under OOM (%d of %d polls): %v", len(gaps), polls, gaps[:min(len(gaps), 10)])
	}
	if err := admin.SetNX(context.Background(), "lock:oom:probe", "x", time.Second).Err(); !redis.HasErrorPrefix(err, "OOM") {
		t.Fatalf("SET NX at the end of the OOM phase: %v, want OOM (the phase must run under OOM throughout)", err)
	}
	var refused *warmer.WriteRefusedError
	if err := w.WritesRefused(); !errors.As(err, &refused) || refused.Code != warmer.RefusedOOM || !strings.Contains(err.Error(), "OOM") {
		t.Errorf("WritesRefused under OOM = %v, want a WriteRefusedError naming OOM", err)
	}
	if m := missed(); m != 0 {
		t.Errorf("keepwarm_warmer_hot_expired_total = %v under OOM, want 0", m)
	}
	if c := logs.Count(oomLine); c != 1 {
		t.Errorf("%q logged %d times in one OOM episode, want once\n%s", oomLine, c, logs)
	}
	if c := logs.Count("lock refused by Redis"); c != 0 {
		t.Errorf("%q logged %d times: OOM refusals must not be logged per batch", "lock refused by Redis", c)
	}

	testenv.FreeOOM(t, admin, junk)
	ok0 := ok()
	testenv.EventuallyDiag(t, 20*time.Second, "refreshes under the lock resume, writes taken", func() (bool, string) {
		metas, _ := obs.Keys(context.Background(), "meta:oom:*").Result()
		return ok() >= ok0+2*n && w.WritesRefused() == nil && len(metas) == 0,
			fmt.Sprintf("%v refreshes ok since, WritesRefused %v, %d meta hashes left", ok()-ok0, w.WritesRefused(), len(metas))
	})
	watch.end()
	if gaps, polls := watch.result(); len(gaps) > 0 {
		t.Errorf("hot keys absent (%d of %d polls): %v", len(gaps), polls, gaps[:min(len(gaps), 10)])
	}
	if m := missed(); m != 0 {
		t.Errorf("keepwarm_warmer_hot_expired_total = %v, want 0", m)
	}
	if f := counter(t, reg, "keepwarm_warmer_flushes_detected_total", nil); f != 0 {
		t.Errorf("keepwarm_warmer_flushes_detected_total = %v after the OOM, want 0: nothing was flushed", f)
	}
	if c := logs.Count(oomLine); c != 1 {
		t.Errorf("%q logged %d times, want once for the one episode", oomLine, c)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("metrics lint: %v %v", problems, err)
	}
}
