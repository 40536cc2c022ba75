package warmer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/warmer"
)

// TestDeadReplicaLocksLapseWithinLead: replica a is cut off Redis (as a kill -9 or a partition would) in the
// middle of a refresh, holding the locks of its batch, with the demo's lock_ttl of 10 s and a lead of 2 s. The
// daemon's own locks are short leases (a quarter of the lead here: 500 ms), so a's locks lapse long before the
// keys expire and replica b, which inherits a's keys, refreshes them in time: a poller of its own (PTTL of every
// key every 50 ms) never finds a key missing, and b's SLO counter stays 0. With leases of lock_ttl, a's locks
// outlived the keys (the 13 keys gone ~8 s after a kill -9).
func TestDeadReplicaLocksLapseWithinLead(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 20)
	ctx := context.Background()
	ids := pinnedIDs(20)
	const lead = 2 * time.Second
	mutate := func(cfg *warmer.KeyspaceConfig) {
		cfg.TTL, cfg.RefreshAhead, cfg.Jitter = 4*time.Second, lead, 0            // no jitter: a's keys come due together
		cfg.LockTTL, cfg.StatementTimeout = 10*time.Second, 1500*time.Millisecond // the demo's
	}
	proxy := testenv.Proxy(t, testenv.RedisAddr(t))
	cut := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { cut.Close() })
	b := startLeaseReplica(t, f, testenv.Redis(t), "b", ids, mutate)
	a := startLeaseReplica(t, f, cut, "a", ids, mutate)
	testenv.Eventually(t, 10*time.Second, "two members, all 20 keys written, a owns some", func() bool {
		n, _ := f.rdb.Exists(ctx, keysOf(f, ids)...).Result()
		return len(a.w.Fleet().Members) == 2 && len(b.w.Fleet().Members) == 2 && owned(a.w) > 0 && n == int64(len(ids))
	})

	// The poller: its own client, PTTL of every key every 50 ms, from now until the end.
	obs := observe(t, f.rdb, keysOf(f, ids)...)

	// a's next batch blocks in its origin query, holding its locks; then a's Redis link is cut.
	inQuery := make(chan []string, 1)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // before the replicas stop (cleanups run last-in first-out)
	var armed atomic.Bool
	armed.Store(true)
	a.src.mu.Lock()
	a.src.before = func(batch []string) {
		if armed.CompareAndSwap(true, false) {
			inQuery <- batch
			<-release
		}
	}
	a.src.mu.Unlock()
	var batch []string
	select {
	case batch = <-inQuery:
	case <-time.After(10 * time.Second):
		t.Fatal("a ran no refresh within 10 s")
	}
	proxy.Cut()
	cutAt := time.Now()
	t.Logf("a cut off Redis in the middle of a batch of %d keys", len(batch))

	// a's locks must lapse within a fraction of the lead: measure when the last one is gone.
	locks := make([]string, len(batch))
	for i, id := range batch {
		locks[i] = f.keySet(t, id).Lock
	}
	var lapsed time.Duration
	testenv.Eventually(t, 15*time.Second, "a's locks gone", func() bool {
		n, _ := f.rdb.Exists(ctx, locks...).Result()
		lapsed = time.Since(cutAt)
		return n == 0
	})
	t.Logf("a's %d locks gone %v after the cut", len(locks), lapsed.Round(time.Millisecond))
	if lapsed > lead/2 {
		t.Errorf("a's locks lived %v after a was cut, want < lead/2 = %v", lapsed, lead/2)
	}

	// b inherits a's keys and refreshes each of a's batch at least once; the poller runs all along.
	before := map[string]int{}
	for _, id := range batch {
		before[id] = b.src.count(id)
	}
	testenv.Eventually(t, 15*time.Second, "b refreshed every key of a's batch", func() bool {
		for _, id := range batch {
			if b.src.count(id) <= before[id] {
				return false
			}
		}
		return true
	})
	polled := obs.pollsSoFar() // the poller's last looks at the refreshed keys (it reads Redis, not a count)
	testenv.Eventually(t, 5*time.Second, "two more polls", func() bool { return obs.pollsSoFar() >= polled+2 })
	obs.stop()
	for _, g := range obs.all() {
		t.Errorf("the poller found %s missing for %v; want 0", g.key, g.end.Sub(g.start))
	}
	if n := counter(t, b.reg, "keepwarm_warmer_hot_expired_total", nil); n != 0 {
		t.Errorf("b: SLO counter %v after taking over a's keys, want 0", n)
	}
}

// startLeaseReplica is startReplica with the keyspace config changed by mutate.
func startLeaseReplica(t *testing.T, f *fixture, rdb redis.UniversalClient, id string, pinned []string, mutate func(*warmer.KeyspaceConfig)) *replica {
	t.Helper()
	r := &replica{id: id, src: &countingSource{src: f.src.src}}
	cfg := f.config(pinned...)
	cfg.TopN = 0
	cfg.Src = r.src
	mutate(&cfg)
	r.w, r.reg, r.stop = start(t, rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg},
		Fleet: warmer.FleetConfig{Key: f.prefix + "fleet", ReplicaID: id, HeartbeatInterval: fleetInterval, HeartbeatTTL: fleetTTL}})
	return r
}
