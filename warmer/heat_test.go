package warmer_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/warmer"
)

// setConfig changes a Redis server setting for the test and restores it on cleanup. The tests that use it run
// on a private redis-server, so the change never reaches other packages' tests on the shared one.
func setConfig(t *testing.T, rdb *redis.Client, name, value string) {
	t.Helper()
	ctx := context.Background()
	old, err := rdb.ConfigGet(ctx, name).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigSet(ctx, name, value).Err(); err != nil {
		t.Fatalf("CONFIG SET %s %s: %v", name, value, err)
	}
	t.Cleanup(func() { rdb.ConfigSet(context.Background(), name, old[name]) })
}

// TestLFUSignalMakesKeysHot: with an LFU maxmemory-policy, ids whose keys the apps read most (OBJECT FREQ) become
// hot even though nothing feeds the access set.
func TestLFUSignalMakesKeysHot(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 20)
	f.rdb = testenv.PrivateRedis(t)
	ctrl := f.rdb
	setConfig(t, ctrl, "maxmemory-policy", "allkeys-lfu")
	setConfig(t, ctrl, "lfu-log-factor", "0") // count every access, so the test is deterministic
	ctx := context.Background()
	for i, id := range []string{"1", "2", "3", "4"} {
		f.rdb.Set(ctx, f.key(id), "app", time.Minute)
		for n := 0; n < 40*(4-i); n++ { // 1 read most, 4 least
			f.rdb.Get(ctx, f.key(id))
		}
	}
	cfg := f.config()
	cfg.TopN, cfg.MinScore, cfg.LFU = 2, 0, true
	cfg.LFUScanCount = 1_000_000 // one SCAN step covers the whole database
	started := time.Now()
	w, _, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	var keys []warmer.KeyStatus
	testenv.Eventually(t, 3*time.Second, "the two most-read keys are hot", func() bool {
		st := w.Status(0)
		if len(st) != 1 || st[0].Hot != 2 {
			return false
		}
		keys = st[0].Keys
		hot := map[string]bool{}
		for _, k := range st[0].Keys {
			hot[k.ID] = true
		}
		return hot["1"] && hot["2"]
	})
	// The status says since when each key is hot (the soak's observer judges ownership by it).
	for _, k := range keys {
		if k.HotSince.Before(started) || k.HotSince.After(time.Now()) {
			t.Errorf("key %s: hot_since %v, want between the start %v and now", k.ID, k.HotSince, started)
		}
	}
}

// TestNotificationsGiveEarlyNotice: with keyspace notifications on and reconciliation slowed to once a minute, a
// hot key an app deletes is rebuilt within a second: only the notification can have told the daemon.
func TestNotificationsGiveEarlyNotice(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 5)
	f.rdb = testenv.PrivateRedis(t)
	ctrl := f.rdb
	setConfig(t, ctrl, "notify-keyspace-events", "Exeg$")
	cfg := f.config("1")
	cfg.TTL = time.Minute
	cfg.RefreshAhead = 10 * time.Second
	cfg.ReconcileEvery = time.Minute
	start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Notifications: true})
	ctx := context.Background()
	testenv.Eventually(t, 3*time.Second, "key written", func() bool { return f.rdb.Exists(ctx, f.key("1")).Val() == 1 })
	testenv.Eventually(t, 10*time.Second, "the daemon subscribed to keyspace notifications", func() bool {
		return f.rdb.PubSubNumSub(ctx, "__keyevent@0__:del").Val()["__keyevent@0__:del"] > 0
	})
	f.rdb.Del(ctx, f.key("1"))
	// Reconciliation runs once a minute: a rebuild within 10 s can only come from the notification.
	testenv.Eventually(t, 10*time.Second, "deleted hot key rebuilt on notice", func() bool {
		return f.rdb.Exists(ctx, f.key("1")).Val() == 1
	})
}
