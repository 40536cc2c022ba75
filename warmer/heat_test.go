package warmer_test

import (
	"context"
	"slices"
	"strconv"
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

// TestLFUAdmissionKeepsOneOffKeysOut: under allkeys-lfu, with Redis's default logarithmic counter (lfu-log-factor
// 10), keys written and read once never take a hot slot, however many spare slots there are, and keys read
// hundreds of times still become hot through the LFU signal alone (were one LFU increment to admit, 1,000 such
// keys would take all 150 spare slots). The observer is outside the warmer's selection: the hot set it
// reports at every poll, and the ids the origin was asked for.
func TestLFUAdmissionKeepsOneOffKeysOut(t *testing.T) {
	t.Parallel()
	const hotN, oneOff = 20, 1000
	f := newFixture(t, hotN+oneOff)
	f.rdb = testenv.PrivateRedis(t)
	setConfig(t, f.rdb, "maxmemory-policy", "allkeys-lfu")
	setConfig(t, f.rdb, "lfu-log-factor", "10") // Redis's default, stated: the counter is logarithmic
	ctx := context.Background()
	pipe := f.rdb.Pipeline()
	for i := 1; i <= hotN+oneOff; i++ {
		id := strconv.Itoa(i)
		pipe.Set(ctx, f.key(id), "app", time.Hour) // an app's miss path wrote it
		reads := 1                                 // then read it once
		if i <= hotN {
			reads = 300 // or read it 300 times: P(counter still at 1) = (10/11)^299 ≈ 4e-13
		}
		for range reads {
			pipe.Get(ctx, f.key(id))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	cfg := f.config()
	cfg.TopN, cfg.MinScore, cfg.LFU = hotN+150, 0, true // 150 spare slots
	cfg.LFUScanCount = 1_000_000                        // one SCAN step covers the whole database
	cfg.DecayHalfLife = 10 * time.Second                // the access set decays once a second: the test's clock
	w, reg, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	isHot := func(id string) bool { n, _ := strconv.Atoi(id); return n >= 1 && n <= hotN }
	var offenders []string
	check := func() (hot int) {
		for _, st := range w.Status(0) {
			for _, k := range st.Keys {
				if isHot(k.ID) {
					hot++
				} else if !slices.Contains(offenders, k.ID) {
					offenders = append(offenders, k.ID)
				}
			}
		}
		return hot
	}
	testenv.Eventually(t, 10*time.Second, "the 20 keys read 300 times are hot", func() bool { return check() == hotN })
	// Then several more polls (each scans every key's OBJECT FREQ): wait for 5 more decays of the access set, one a
	// second, checking the hot set all the while.
	decays := func() float64 {
		return counter(t, reg, "keepwarm_warmer_access_decays_total", map[string]string{"keyspace": "items"})
	}
	until := decays() + 5
	testenv.Eventually(t, 30*time.Second, "5 more decays of the access set", func() bool {
		if n := check(); n != hotN {
			t.Errorf("%d of the %d hot keys are hot", n, hotN)
		}
		return decays() >= until
	})
	if len(offenders) > 0 {
		t.Errorf("%d keys read once took hot slots: %v", len(offenders), offenders[:min(len(offenders), 10)])
	}
	// The origin was never asked for a key read once; and none of them was overwritten.
	for i := hotN + 1; i <= hotN+oneOff; i++ {
		if n := f.src.count(strconv.Itoa(i)); n > 0 {
			t.Errorf("the origin was asked %d times for id %d, read once", n, i)
		}
	}
	for i := hotN + 1; i <= hotN+oneOff; i++ {
		if v := f.rdb.Get(ctx, f.key(strconv.Itoa(i))).Val(); v != "app" {
			t.Fatalf("key %s holds %q, want the app's value", f.key(strconv.Itoa(i)), v)
		}
	}
}
