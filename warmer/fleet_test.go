package warmer_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/warmer"
)

const (
	fleetInterval = 150 * time.Millisecond
	fleetTTL      = 600 * time.Millisecond
)

// replica is one warmer of a test fleet, with its own Redis client and its own counting source.
type replica struct {
	id   string
	w    *warmer.Warmer
	reg  *prometheus.Registry
	src  *countingSource
	stop func()
}

func startReplica(t *testing.T, f *fixture, rdb redis.UniversalClient, id string, pinned []string) *replica {
	t.Helper()
	r := &replica{id: id, src: &countingSource{src: f.src.src}}
	cfg := f.config(pinned...)
	cfg.TopN = 0
	cfg.Src = r.src
	// Leads long enough for four warmers under -race on a loaded 2-core machine (the fixture's 600 ms lost keys
	// there, with or without a fleet). A dead replica's in-flight keys stay locked until their lease ends, which
	// the daemon keeps at most lead/4 (KeyspaceConfig.lease) whatever lock_ttl says.
	cfg.TTL, cfg.RefreshAhead, cfg.LockTTL = 4*time.Second, 2*time.Second, time.Second
	r.w, r.reg, r.stop = start(t, rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg},
		Fleet: warmer.FleetConfig{Key: f.prefix + "fleet", ReplicaID: id, HeartbeatInterval: fleetInterval, HeartbeatTTL: fleetTTL}})
	return r
}

func members(w *warmer.Warmer) string {
	s := ""
	for _, m := range w.Fleet().Members {
		s += m.ID
		if m.Late {
			s += "(late)"
		}
		s += " "
	}
	return s
}

func owned(w *warmer.Warmer) int {
	st := w.Status(1)
	if len(st) != 1 {
		return -1
	}
	return st[0].Owned
}

func pinnedIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = strconv.Itoa(i + 1)
	}
	return ids
}

// snapshot returns how often each replica's source was asked for each id.
func snapshot(rs []*replica, ids []string) map[string][]int {
	out := map[string][]int{}
	for _, id := range ids {
		for _, r := range rs {
			out[id] = append(out[id], r.src.count(id))
		}
	}
	return out
}

// TestFleetSharesKeys: three replicas of one fleet each refresh a third of the hot keys, and no key is queried
// by two of them once the member list has settled.
func TestFleetSharesKeys(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 60)
	ids := pinnedIDs(60)
	var rs []*replica
	for _, id := range []string{"a", "b", "c"} {
		rs = append(rs, startReplica(t, f, testenv.Redis(t), id, ids))
	}
	testenv.Eventually(t, 10*time.Second, "three members, each owning a share, 60 in all", func() bool {
		sum := 0
		for _, r := range rs {
			if len(r.w.Fleet().Members) != 3 || owned(r.w) == 0 {
				return false
			}
			sum += owned(r.w)
		}
		return sum == len(ids)
	})
	// Batches formed under an older member list may still be running: wait until every key has been queried
	// once more since the list settled (an event, not a pause), then start counting.
	settled := snapshot(rs, ids)
	testenv.Eventually(t, 30*time.Second, "every key refreshed once since the member list settled", func() bool {
		now := snapshot(rs, ids)
		for _, id := range ids {
			sum := 0
			for i := range rs {
				sum += now[id][i] - settled[id][i]
			}
			if sum < 1 {
				return false
			}
		}
		return true
	})
	changes := func() float64 {
		sum := 0.0
		for _, r := range rs {
			sum += counter(t, r.reg, "keepwarm_warmer_fleet_ownership_changes_total", nil)
		}
		return sum
	}
	changesBefore := changes()
	before := snapshot(rs, ids)
	testenv.Eventually(t, 30*time.Second, "every key refreshed twice more", func() bool {
		now := snapshot(rs, ids)
		for _, id := range ids {
			sum := 0
			for i := range rs {
				sum += now[id][i] - before[id][i]
			}
			if sum < 2 {
				return false
			}
		}
		return true
	})
	after := snapshot(rs, ids)
	// A heartbeat delayed past 1.5 intervals (a starved process) makes a member late for a moment and moves its
	// keys; the lock keeps that safe, but then two replicas may each refresh a key once. Strict only when no
	// replica saw the owners change.
	quiet := changes() == changesBefore
	shared := 0
	for _, id := range ids {
		by, sum := 0, 0
		for i := range rs {
			if after[id][i] > before[id][i] {
				by++
			}
			sum += after[id][i] - before[id][i]
		}
		if by != 1 {
			shared++
			if quiet {
				t.Errorf("id %s queried by %d replicas after the fleet settled (%v → %v), want 1", id, by, before[id], after[id])
			}
		}
		if sum > 3 {
			t.Errorf("id %s queried %d times while every key needed 2 refreshes: rebuilt twice for one value?", id, sum)
		}
	}
	if !quiet {
		t.Logf("owners changed during the window (a late heartbeat): %d of %d ids refreshed by two replicas", shared, len(ids))
	}
	for _, r := range rs {
		t.Logf("%s owns %d: %s", r.id, owned(r.w), members(r.w))
	}
}

// TestFleetTakesOverFromDeadReplica cuts one replica off Redis (as a kill -9 or a partition would): the others
// see it late, cover its keys, drop it from the fleet, and no hot key expires.
func TestFleetTakesOverFromDeadReplica(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 60)
	ids := pinnedIDs(60)
	proxy := testenv.Proxy(t, testenv.RedisAddr(t))
	cut := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { cut.Close() })
	a := startReplica(t, f, testenv.Redis(t), "a", ids)
	b := startReplica(t, f, testenv.Redis(t), "b", ids)
	c := startReplica(t, f, cut, "c", ids)
	testenv.Eventually(t, 10*time.Second, "three members, all 60 keys written", func() bool {
		n, _ := f.rdb.Exists(context.Background(), keysOf(f, ids)...).Result()
		return len(a.w.Fleet().Members) == 3 && len(b.w.Fleet().Members) == 3 && owned(c.w) > 0 && n == int64(len(ids))
	})
	cOwned := owned(c.w)
	proxy.Cut()
	testenv.Eventually(t, 5*time.Second, "c dropped from the fleet by a and b", func() bool {
		return len(a.w.Fleet().Members) == 2 && len(b.w.Fleet().Members) == 2
	})
	if got := owned(a.w) + owned(b.w); got != len(ids) {
		t.Errorf("a and b own %d keys after c left, want %d", got, len(ids))
	}
	// c's keys must be refreshed by a and b from now on: wait for two more TTLs of refreshes of every key and
	// check, all along, that every key exists.
	before := snapshot([]*replica{a, b}, ids)
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, err := f.rdb.Exists(context.Background(), keysOf(f, ids)...).Result()
		if err != nil || n != int64(len(ids)) {
			t.Fatalf("%d of %d hot keys present after c was cut (err %v)", n, len(ids), err)
		}
		now := snapshot([]*replica{a, b}, ids)
		done := true
		for _, id := range ids {
			if now[id][0]+now[id][1]-before[id][0]-before[id][1] < 2 {
				done = false
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a and b did not refresh every key twice within 20 s of c's cut")
		}
		time.Sleep(20 * time.Millisecond) // polling Redis for the keys' presence, not waiting for a count
	}
	for _, r := range []*replica{a, b} {
		if n := counter(t, r.reg, "keepwarm_warmer_hot_expired_total", nil); n != 0 {
			t.Errorf("%s: SLO counter %v after taking over %d keys from c, want 0", r.id, n, cOwned)
		}
	}
}

// TestFleetLateMemberIsCovered: a member that stays in the set without renewing its heartbeat (a stuck
// replica) is shown late, and its keys are refreshed by the others until its heartbeat expires.
func TestFleetLateMemberIsCovered(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 30)
	ids := pinnedIDs(30)
	ctx := context.Background()
	key := f.prefix + "fleet"
	// The stuck member's heartbeat is renewed to just past "late" for a while: in the set, but never on time.
	stuck := func() {
		tm, err := f.rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		f.rdb.ZAdd(ctx, key, redis.Z{Score: float64(tm.Add(fleetTTL / 2).UnixMilli()), Member: "stuck"})
	}
	stuck()
	a := startReplica(t, f, testenv.Redis(t), "a", ids)
	b := startReplica(t, f, testenv.Redis(t), "b", ids)
	testenv.Eventually(t, 10*time.Second, "both see the stuck member as late", func() bool {
		stuck()
		return members(a.w) == "a b stuck(late) " && members(b.w) == "a b stuck(late) "
	})
	if got := owned(a.w) + owned(b.w); got != len(ids) {
		t.Errorf("a and b own %d keys while the stuck member is late, want all %d", got, len(ids))
	}
	before := snapshot([]*replica{a, b}, ids)
	testenv.Eventually(t, 20*time.Second, "every key refreshed twice while the stuck member is in the set", func() bool {
		stuck()
		now := snapshot([]*replica{a, b}, ids)
		for _, id := range ids {
			if now[id][0]+now[id][1]-before[id][0]-before[id][1] < 2 {
				return false
			}
		}
		return true
	})
	testenv.Eventually(t, 5*time.Second, "the stuck member removed once its heartbeat expired", func() bool {
		return members(a.w) == "a b "
	})
	for _, r := range []*replica{a, b} {
		if n := counter(t, r.reg, "keepwarm_warmer_hot_expired_total", nil); n != 0 {
			t.Errorf("%s: SLO counter %v, want 0", r.id, n)
		}
	}
}

// TestFleetCleanLeave: a replica that stops removes itself at once, and the other takes all keys.
func TestFleetCleanLeave(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 20)
	ids := pinnedIDs(20)
	a := startReplica(t, f, testenv.Redis(t), "a", ids)
	b := startReplica(t, f, testenv.Redis(t), "b", ids)
	testenv.Eventually(t, 10*time.Second, "two members", func() bool { return members(a.w) == "a b " && owned(b.w) > 0 })
	b.stop()
	if n, err := f.rdb.ZScore(context.Background(), f.prefix+"fleet", "b").Result(); err != redis.Nil {
		t.Errorf("b still in the member set after it stopped: score %v, err %v", n, err)
	}
	testenv.Eventually(t, 2*time.Second, "a alone, owning every key", func() bool {
		return members(a.w) == "a " && owned(a.w) == len(ids)
	})
	if got := b.w.Fleet(); !got.Enabled || got.ReplicaID != "b" {
		t.Errorf("Fleet() = %+v, want enabled with replica id b", got)
	}
}

func TestFleetConfigErrors(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	for _, tc := range []struct {
		fc   warmer.FleetConfig
		want string
	}{
		{warmer.FleetConfig{Key: "k", HeartbeatInterval: time.Second, HeartbeatTTL: time.Second}, "heartbeat_ttl"},
		{warmer.FleetConfig{Key: "k", HeartbeatInterval: time.Millisecond}, "heartbeat_interval"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			_, err := warmer.New(f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{f.config("1")}, Fleet: tc.fc})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New(%+v) = %v, want an error naming %s", tc.fc, err, tc.want)
			}
		})
	}
	if k1, k2 := warmer.DefaultFleetKey([]string{"a:${id}", "b:${id}"}), warmer.DefaultFleetKey([]string{"b:${id}", "a:${id}"}); k1 != k2 {
		t.Errorf("DefaultFleetKey depends on order: %s vs %s", k1, k2)
	}
	if k1, k2 := warmer.DefaultFleetKey([]string{"a:${id}"}), warmer.DefaultFleetKey([]string{"b:${id}"}); k1 == k2 {
		t.Errorf("DefaultFleetKey(%s) = DefaultFleetKey(other layout)", k1)
	}
}

func keysOf(f *fixture, ids []string) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = f.key(id)
	}
	return out
}

// heldCheckSource is a countingSource whose start-up check (warmer.Checker) waits until release is closed:
// its keyspace's loop, and so its first poll of the hot keys, waits with it.
type heldCheckSource struct {
	*countingSource
	called  chan struct{} // closed at the first check
	once    sync.Once
	release chan struct{}
}

func (s *heldCheckSource) Check(ctx context.Context) error {
	s.once.Do(func() { close(s.called) })
	select {
	case <-s.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestFleetJoinsOnceItKnowsItsKeys: a replica that starts (a restart after kill -9, a scale-out) joins its fleet
// only once its keyspaces have read their hot keys. Until then it is not in the member set and the members
// already there keep every key; then it takes its share. Joining first handed it keys it did not know: the others
// gave them up at once, and keys falling due meanwhile expired without anyone counting them.
func TestFleetJoinsOnceItKnowsItsKeys(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 20)
	ctx := context.Background()
	ids := pinnedIDs(20)
	a := startReplica(t, f, testenv.Redis(t), "a", ids)
	testenv.Eventually(t, 10*time.Second, "a alone owns all 20 keys", func() bool { return owned(a.w) == len(ids) })

	held := &heldCheckSource{countingSource: &countingSource{src: f.src.src}, called: make(chan struct{}),
		release: make(chan struct{})}
	cfg := f.config(ids...)
	cfg.TopN = 0
	cfg.Src = held
	cfg.TTL, cfg.RefreshAhead, cfg.LockTTL = 4*time.Second, 2*time.Second, time.Second
	released := false
	t.Cleanup(func() {
		if !released {
			close(held.release)
		}
	})
	b, breg, _ := start(t, testenv.Redis(t), warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg},
		Fleet: warmer.FleetConfig{Key: f.prefix + "fleet", ReplicaID: "b", HeartbeatInterval: fleetInterval, HeartbeatTTL: fleetTTL}})
	select {
	case <-held.called:
	case <-time.After(10 * time.Second):
		t.Fatal("b never checked its source")
	}
	// b's keyspace is held before its first poll. Three of a's heartbeats later, b is still out of the fleet.
	beats := func(reg *prometheus.Registry) float64 {
		return counter(t, reg, "keepwarm_warmer_fleet_heartbeats_total", map[string]string{"result": "ok"})
	}
	from := beats(a.reg)
	testenv.Eventually(t, 10*time.Second, "three more heartbeats of a", func() bool { return beats(a.reg) >= from+3 })
	inSet, err := f.rdb.ZRange(ctx, f.prefix+"fleet", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(inSet) != 1 || inSet[0] != "a" {
		t.Errorf("member set while b has not read its hot keys: %v, want [a]", inSet)
	}
	if n := owned(a.w); n != len(ids) {
		t.Errorf("a owns %d keys while b has not read its hot keys, want all %d", n, len(ids))
	}
	if n := beats(breg); n != 0 {
		t.Errorf("b heartbeat %v times before its keyspace had polled, want 0", n)
	}

	close(held.release)
	released = true
	testenv.Eventually(t, 10*time.Second, "b joined and took a share", func() bool {
		return len(a.w.Fleet().Members) == 2 && owned(b) > 0 && owned(a.w) < len(ids) && owned(a.w)+owned(b) == len(ids)
	})
}
