package clustertest

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/warmer"
)

// masters returns the Cluster's master addresses, sorted.
func masters(t *testing.T, cc *redis.ClusterClient) []string {
	t.Helper()
	var out []string
	slots, err := cc.ClusterSlots(context.Background()).Result() //lint:ignore SA1019 CLUSTER SHARDS is Redis 7.0+; the daemon supports 6.2, whose only map is CLUSTER SLOTS
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if !slices.Contains(out, s.Nodes[0].Addr) {
			out = append(out, s.Nodes[0].Addr)
		}
	}
	slices.Sort(out)
	return out
}

// slotOwner returns the master of slot and its replicas, with their node ids.
func slotOwner(t *testing.T, cc *redis.ClusterClient, slot int) (master redis.ClusterNode, replicas []redis.ClusterNode) {
	t.Helper()
	slots, err := cc.ClusterSlots(context.Background()).Result() //lint:ignore SA1019 CLUSTER SHARDS is Redis 7.0+; the daemon supports 6.2, whose only map is CLUSTER SLOTS
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if slot >= s.Start && slot <= s.End {
			return s.Nodes[0], s.Nodes[1:]
		}
	}
	t.Fatalf("no node serves slot %d", slot)
	return
}

func keySlot(t *testing.T, cc *redis.ClusterClient, key string) int {
	t.Helper()
	n, err := cc.ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

func node(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// subscribedNodes returns the addresses of the nodes the daemon listens to whose notifications are on.
func subscribedNodes(w *warmer.Warmer) []string {
	var out []string
	for _, n := range w.NotificationNodes() {
		if n.Subscribed && n.Missing == "" && n.Error == "" {
			out = append(out, n.Addr)
		}
	}
	return out
}

// TestClusterAcrossMasters: a warmup, the daemon's refreshes and lockstep reads of 60 ids whose keys (one hash
// tag per id) spread over all three masters; the daemon subscribes to keyevents on each master and sets their
// notify-keyspace-events itself.
func TestClusterAcrossMasters(t *testing.T) {
	cc := testenv.Cluster(t)
	p := testenv.ClusterPrefix(t, cc)
	f := newFixture(t, cc, 60, p+"item:{${id}}")
	ms := masters(t, cc)
	if len(ms) != 3 {
		t.Fatalf("masters: got %v, want 3", ms)
	}
	perMaster := map[string]int{}
	for _, id := range f.ids {
		m, _ := slotOwner(t, cc, keySlot(t, cc, p+"item:{"+id+"}"))
		perMaster[m.Addr]++
	}
	if len(perMaster) != 3 {
		t.Fatalf("the 60 ids' keys fall on %d masters (%v), want all 3", len(perMaster), perMaster)
	}
	ctx := context.Background()
	cfg := f.config(4*time.Second, 2*time.Second)
	d := startDaemon(t, cc, cfg)
	res, err := d.w.Warmup(ctx, "items", warmer.SliceIDs(f.ids), warmer.WarmupOptions{})
	if err != nil || res.Written+res.SkippedLocked != 60 || res.Failed != 0 {
		t.Fatalf("warmup: %+v, %v; want 60 written (or skipped as being refreshed), 0 failed", res, err)
	}
	testenv.Eventually(t, 10*time.Second, "subscribed on every master, flags set", func() bool {
		return slices.Equal(subscribedNodes(d.w), ms) && d.metric(t, "keepwarm_warmer_notifications_enabled", nil) == 1 &&
			d.metric(t, "keepwarm_warmer_notification_nodes", nil) == 3
	})
	for _, m := range ms {
		flags, err := node(t, m).ConfigGet(ctx, "notify-keyspace-events").Result()
		if err != nil || warmer.MissingNotifyFlags(flags["notify-keyspace-events"]) != "" {
			t.Errorf("master %s: notify-keyspace-events %q (%v): want Exeg$ set by notifications = \"auto\"", m, flags, err)
		}
	}
	r := f.startReaders(t, 3, cfg.TTL, 2*time.Millisecond)
	base := d.refreshed(t)
	// Every key refreshed twice more by the daemon (each on its own master), while the apps read.
	testenv.Eventually(t, 30*time.Second, "every key refreshed twice", func() bool { return d.refreshed(t) >= base+120 })
	testenv.Eventually(t, 10*time.Second, "apps read every key", func() bool { return r.hits.Load() >= 300 })
	for _, id := range f.ids {
		if n, err := cc.Exists(ctx, p+"item:{"+id+"}").Result(); err != nil || n != 1 {
			t.Errorf("key of id %s: exists %d, %v", id, n, err)
		}
	}
	d.slo(t)
	if r.misses.Load() != 0 || r.errs.Load() != 0 || r.regressions.Load() != 0 {
		t.Errorf("apps: %v; want no miss, error or regression on keys the daemon keeps warm", r)
	}
	t.Logf("apps: %v; daemon refreshes ok %v; keys per master %v", r, d.refreshed(t), perMaster)
}

// migrateSlot moves slot from its master to the master to (any other master when to is "") the way redis-cli
// --cluster reshard does, one key per MIGRATE with pause between keys, and returns the number of keys moved and
// the source and target addresses.
func migrateSlot(t *testing.T, cc *redis.ClusterClient, slot int, to string, pause time.Duration) (int, string, string) {
	t.Helper()
	ctx := context.Background()
	src, _ := slotOwner(t, cc, slot)
	var dst redis.ClusterNode
	for _, s := range mustSlots(t, cc) {
		if s.Nodes[0].ID != src.ID && (to == "" || s.Nodes[0].Addr == to) {
			dst = s.Nodes[0]
			break
		}
	}
	if dst.ID == "" || src.ID == dst.ID {
		t.Fatalf("slot %d: no master to move it to from %s (want %q)", slot, src.Addr, to)
	}
	sc, dc := node(t, src.Addr), node(t, dst.Addr)
	if err := dc.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", src.ID).Err(); err != nil {
		t.Fatalf("SETSLOT IMPORTING on %s: %v", dst.Addr, err)
	}
	if err := sc.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst.ID).Err(); err != nil {
		t.Fatalf("SETSLOT MIGRATING on %s: %v", src.Addr, err)
	}
	host, port, _ := net.SplitHostPort(dst.Addr)
	moved := 0
	for deadline := time.Now().Add(40 * time.Second); ; {
		keys, err := sc.ClusterGetKeysInSlot(ctx, slot, 1).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot %d still has keys on %s after 40 s", slot, src.Addr)
		}
		err = sc.Migrate(ctx, host, port, keys[0], 0, 5*time.Second).Err()
		switch {
		case err == nil:
			moved++
		case strings.Contains(err.Error(), "NOKEY"): // expired meanwhile
		default:
			t.Fatalf("MIGRATE %s: %v", keys[0], err)
		}
		time.Sleep(pause) // pacing the migration, not waiting for a result
	}
	// Finalise as redis-cli does: the target first, then the source, then every other master.
	for _, c := range []*redis.Client{dc, sc} {
		if err := c.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dst.ID).Err(); err != nil {
			t.Fatalf("SETSLOT NODE on %s: %v", c.Options().Addr, err)
		}
	}
	for _, m := range masters(t, cc) {
		if m != src.Addr && m != dst.Addr {
			_ = node(t, m).Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dst.ID).Err()
		}
	}
	return moved, src.Addr, dst.Addr
}

func mustSlots(t *testing.T, cc *redis.ClusterClient) []redis.ClusterSlot {
	t.Helper()
	s, err := cc.ClusterSlots(context.Background()).Result() //lint:ignore SA1019 CLUSTER SHARDS is Redis 7.0+; the daemon supports 6.2, whose only map is CLUSTER SLOTS
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestClusterSlotMigrationKeyByKey: while the daemon refreshes 40 hot keys (one hash tag per id) every 2 s and
// apps read them, the slots of 8 of them are migrated to another master the way a resharding does, one slot after
// the other and each key by key with a pause. MIGRATE deletes each key on the source node, which publishes a del
// keyevent there: the daemon must not count those as vanished hot keys, no hot key may expire, the apps must not
// miss, and refreshes go on at the new master.
func TestClusterSlotMigrationKeyByKey(t *testing.T) {
	cc := testenv.Cluster(t)
	p := testenv.ClusterPrefix(t, cc)
	f := newFixture(t, cc, 40, p+"item:{${id}}")
	ctx := context.Background()
	cfg := f.config(4*time.Second, 2*time.Second)
	d := startDaemon(t, cc, cfg)
	testenv.Eventually(t, 15*time.Second, "every key written, notifications on at every master", func() bool {
		return d.refreshed(t) >= 40 && d.metric(t, "keepwarm_warmer_notifications_enabled", nil) == 1
	})
	// The first 8 ids whose slots one master serves.
	bySource := map[string][]int{}
	var src string
	for _, id := range f.ids {
		slot := keySlot(t, cc, p+"item:{"+id+"}")
		m, _ := slotOwner(t, cc, slot)
		if !slices.Contains(bySource[m.Addr], slot) {
			bySource[m.Addr] = append(bySource[m.Addr], slot)
		}
		if len(bySource[m.Addr]) == 8 {
			src = m.Addr
			break
		}
	}
	if src == "" {
		t.Fatalf("no master serves 8 of the 40 ids' slots: %v", bySource)
	}
	r := f.startReaders(t, 3, cfg.TTL, 2*time.Millisecond)
	// The test's own count of the del events that MIGRATE publishes on the source, to show the daemon saw them.
	ps := node(t, src).Subscribe(ctx, "__keyevent@0__:del")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil { // the subscription is confirmed before the first MIGRATE
		t.Fatal(err)
	}
	var dels atomic.Int64
	go func() {
		for m := range ps.Channel() {
			if strings.HasPrefix(m.Payload, p+"item:") {
				dels.Add(1)
			}
		}
	}()
	before := d.refreshed(t)
	moved, dst := 0, ""
	start := time.Now()
	// Afterwards the slots go back at full speed, so that repeated runs leave the slot layout as they found it.
	t.Cleanup(func() {
		for _, slot := range bySource[src] {
			if owner, _ := slotOwner(t, cc, slot); owner.Addr != src {
				migrateSlot(t, cc, slot, src, 0)
			}
		}
	})
	for _, slot := range bySource[src] {
		n, _, to := migrateSlot(t, cc, slot, "", 100*time.Millisecond)
		moved += n
		dst = to
		if owner, _ := slotOwner(t, cc, slot); owner.Addr != to {
			t.Fatalf("slot %d is served by %s, want %s", slot, owner.Addr, to)
		}
	}
	took := time.Since(start)
	refreshedDuring := d.refreshed(t) - before
	if moved < 8 {
		t.Fatalf("moved %d keys, want at least the 8 cache keys", moved)
	}
	testenv.Eventually(t, 5*time.Second, "the source published del for the migrated cache keys", func() bool { return dels.Load() >= 8 })
	after := d.refreshed(t)
	testenv.Eventually(t, 20*time.Second, "every key refreshed again", func() bool { return d.refreshed(t) >= after+40 })
	d.slo(t)
	if r.misses.Load() != 0 || r.errs.Load() != 0 || r.regressions.Load() != 0 {
		t.Errorf("apps: %v; want no miss, error or regression", r)
	}
	t.Logf("8 slots, %d keys moved %s -> %s one by one in %v; del events seen on the source %d; refreshes during the move %v; %s; apps: %v",
		moved, src, dst, took.Round(time.Millisecond), dels.Load(), refreshedDuring, errorReasons(t, d), r)
}

// TestClusterFailover: CLUSTER FAILOVER promotes the replica of the master that serves a third of 60 hot keys,
// while the daemon refreshes them and apps read them. The daemon subscribes on the new master (setting its flags,
// which the replica never had) and drops the old one; no hot key expires, no value goes backwards.
func TestClusterFailover(t *testing.T) {
	cc := testenv.Cluster(t)
	p := testenv.ClusterPrefix(t, cc)
	f := newFixture(t, cc, 60, p+"item:{${id}}")
	ctx := context.Background()
	cfg := f.config(4*time.Second, 2*time.Second)
	d := startDaemon(t, cc, cfg)
	f.bumpEvery(t, 200*time.Millisecond)
	old, replicas := slotOwner(t, cc, keySlot(t, cc, p+"item:{1}"))
	if len(replicas) == 0 {
		t.Fatalf("master %s has no replica: start the cluster with scripts/services up cluster", old.Addr)
	}
	promoted := replicas[0]
	testenv.Eventually(t, 15*time.Second, "every key written, subscribed on the 3 masters", func() bool {
		return d.refreshed(t) >= 60 && slices.Contains(subscribedNodes(d.w), old.Addr) && len(subscribedNodes(d.w)) == 3
	})
	r := f.startReaders(t, 3, cfg.TTL, 2*time.Millisecond)
	testenv.Eventually(t, 5*time.Second, "apps reading", func() bool { return r.hits.Load() > 100 })
	start := time.Now()
	if err := node(t, promoted.Addr).Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		t.Fatalf("CLUSTER FAILOVER on %s: %v", promoted.Addr, err)
	}
	testenv.Eventually(t, 20*time.Second, "the replica is master", func() bool {
		role, err := node(t, promoted.Addr).Do(ctx, "ROLE").Slice()
		return err == nil && len(role) > 0 && role[0] == "master"
	})
	promotedIn := time.Since(start)
	testenv.Eventually(t, 20*time.Second, "the daemon subscribed on the new master, not the old one, flags set", func() bool {
		n := subscribedNodes(d.w)
		return slices.Contains(n, promoted.Addr) && !slices.Contains(n, old.Addr) && len(n) == 3
	})
	resubscribedIn := time.Since(start)
	flags, err := node(t, promoted.Addr).ConfigGet(ctx, "notify-keyspace-events").Result()
	if err != nil || warmer.MissingNotifyFlags(flags["notify-keyspace-events"]) != "" {
		t.Errorf("new master %s: notify-keyspace-events %v (%v), want the flags set by the daemon", promoted.Addr, flags, err)
	}
	after := d.refreshed(t)
	testenv.Eventually(t, 20*time.Second, "every key refreshed after the failover", func() bool { return d.refreshed(t) >= after+60 })
	d.slo(t)
	if r.misses.Load() != 0 || r.errs.Load() != 0 || r.regressions.Load() != 0 {
		t.Errorf("apps: %v; want no miss, error or regression", r)
	}
	errs := d.metric(t, "keepwarm_warmer_refresh_errors_total", nil)
	t.Logf("CLUSTER FAILOVER %s -> %s: promoted after %v, daemon subscribed on it after %v; refresh errors %v (%s); apps: %v",
		old.Addr, promoted.Addr, promotedIn.Round(time.Millisecond), resubscribedIn.Round(time.Millisecond), errs,
		errorReasons(t, d), r)
}

func errorReasons(t *testing.T, d *daemon) string {
	var out []string
	for _, reason := range []string{warmer.ReasonTransport, warmer.ReasonCluster, warmer.ReasonTryAgain, warmer.ReasonReply, warmer.ReasonOrigin} {
		if n := d.metric(t, "keepwarm_warmer_refresh_errors_total", map[string]string{"reason": reason}); n > 0 {
			out = append(out, fmt.Sprintf("%s %v", reason, n))
		}
	}
	for _, res := range []string{warmer.ResultLockLost, warmer.ResultLocked, warmer.ResultFresh} {
		if n := d.metric(t, "keepwarm_warmer_refreshes_total", map[string]string{"result": res}); n > 0 {
			out = append(out, fmt.Sprintf("result %s %v", res, n))
		}
	}
	return strings.Join(out, ", ")
}

// TestClusterFlushCanaryPerMaster: a FLUSHDB runs on one master and publishes no per-key event, so the daemon
// keeps a flush canary on every master (a hash tag in that master's slots). Each master holds one; when one
// master's canary vanishes (as a FLUSHDB of that master would make it; a DEL here, so that other packages' keys on
// the shared Cluster survive), the daemon notices within a second and re-reads every hot key, which are all there:
// no miss is counted.
func TestClusterFlushCanaryPerMaster(t *testing.T) {
	cc := testenv.Cluster(t)
	p := testenv.ClusterPrefix(t, cc)
	f := newFixture(t, cc, 30, p+"item:{${id}}")
	ctx := context.Background()
	d := startDaemon(t, cc, f.config(10*time.Second, 2*time.Second))
	canaries := func(addr string) []string {
		keys, err := node(t, addr).Keys(ctx, "keepwarm:canary:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	ms := masters(t, cc)
	testenv.Eventually(t, 10*time.Second, "a canary on every master", func() bool {
		for _, m := range ms {
			if len(canaries(m)) == 0 {
				return false
			}
		}
		return true
	})
	testenv.Eventually(t, 15*time.Second, "every key written", func() bool { return d.refreshed(t) >= 30 })
	victim := ms[1]
	for _, k := range canaries(victim) {
		if err := node(t, victim).Del(ctx, k).Err(); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 5*time.Second, "the vanished canary noticed", func() bool {
		return d.metric(t, "keepwarm_warmer_flushes_detected_total", nil) >= 1
	})
	testenv.Eventually(t, 5*time.Second, "the canary written again", func() bool { return len(canaries(victim)) > 0 })
	d.slo(t)
}
