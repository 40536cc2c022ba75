package warmer_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/warmer"
)

func TestMissingNotifyFlags(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ flags, want string }{
		{"", "Exeg$"},
		{"E", "xeg$"},
		{"Exeg$", ""},
		{"AE", ""},
		{"AKE", ""},
		{"KA", "E"},   // keyspace channels only: the warmer listens on keyevent channels
		{"Ex", "eg$"}, // expired events only (a common hand-set value)
		{"gxE", "e$"},
		{"Kxeg$", "E"},
	} {
		t.Run(tt.flags, func(t *testing.T) {
			if got := warmer.MissingNotifyFlags(tt.flags); got != tt.want {
				t.Errorf("MissingNotifyFlags(%q): got %q, want %q", tt.flags, got, tt.want)
			}
		})
	}
}

func notifyFlagsOf(t *testing.T, rdb *redis.Client) string {
	t.Helper()
	res, err := rdb.ConfigGet(context.Background(), "notify-keyspace-events").Result()
	if err != nil {
		t.Fatal(err)
	}
	return res["notify-keyspace-events"]
}

// TestNotificationsAutoSurvivesRestart: with notifications = "auto" the daemon sets the flags it needs on a Redis
// that has none, and sets them again after Redis restarts (which resets them), because it re-checks on every
// re-subscribe: the periodic check is an hour here, so only the reconnect can have triggered it. Afterwards a
// deleted hot key is rebuilt on notice, with reconciliation slowed to once a minute.
func TestNotificationsAutoSurvivesRestart(t *testing.T) {
	// Serial: it restarts its redis-server on the same port, which a parallel test's free-port pick could take meanwhile.
	f := newFixture(t, 5)
	srv := testenv.RestartableRedis(t)
	opt, err := redis.ParseURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	f.rdb = redis.NewClient(opt)
	t.Cleanup(func() { f.rdb.Close() })
	ctrl := redis.NewClient(opt)
	t.Cleanup(func() { ctrl.Close() })
	if got := notifyFlagsOf(t, ctrl); got != "" {
		t.Fatalf("a new redis-server has notify-keyspace-events %q, want \"\"", got)
	}
	cfg := f.config("1")
	cfg.TTL, cfg.RefreshAhead, cfg.ReconcileEvery = time.Minute, 10*time.Second, time.Minute
	var logs logLines
	w, reg, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Notifications: true,
		AutoNotifyFlags: true, NodeCheckInterval: time.Hour, Logger: logs.logger()})
	enabled := func() bool {
		return counter(t, reg, "keepwarm_warmer_notifications_enabled", nil) == 1 && w.NotificationsHealthy()
	}
	testenv.Eventually(t, 10*time.Second, "flags set and notifications reported on", func() bool {
		return warmer.MissingNotifyFlags(notifyFlagsOf(t, ctrl)) == "" && enabled()
	})
	if n := logs.count("set notify-keyspace-events"); n != 1 {
		t.Errorf("log lines \"set notify-keyspace-events\": got %d, want 1", n)
	}

	if err := srv.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "after the restart: flags set again and notifications on", func() bool {
		flags, err := ctrl.ConfigGet(context.Background(), "notify-keyspace-events").Result()
		return err == nil && warmer.MissingNotifyFlags(flags["notify-keyspace-events"]) == "" && enabled() &&
			logs.count("re-subscribed after a lost connection") >= 1 && logs.count("set notify-keyspace-events") >= 2
	})
	if n := logs.count("set notify-keyspace-events"); n != 2 {
		t.Errorf("log lines \"set notify-keyspace-events\": got %d, want 2 (start and restart)", n)
	}
	if got := counter(t, reg, "keepwarm_warmer_notification_nodes", nil); got != 1 {
		t.Errorf("keepwarm_warmer_notification_nodes: got %v, want 1", got)
	}

	// The restart emptied Redis. An app writes the key (the daemon learns its expiry from the set event), then
	// deletes it: only the del event can bring the rebuild within 10 s.
	ctx := context.Background()
	f.rdb.Set(ctx, f.key("1"), "app", time.Minute)
	testenv.Eventually(t, 10*time.Second, "the app's write noticed", func() bool {
		for _, k := range w.Status(0)[0].Keys {
			if k.ID == "1" && k.TTL > 30*time.Second {
				return true
			}
		}
		return false
	})
	f.rdb.Del(ctx, f.key("1"))
	testenv.Eventually(t, 10*time.Second, "deleted hot key rebuilt on notice after the restart", func() bool {
		v, err := f.rdb.Get(ctx, f.key("1")).Result()
		return err == nil && strings.Contains(v, `"id": 1`)
	})
}

// TestNotificationsOnReportsOff: with notifications = "on" the daemon leaves Redis's setting alone, reports it off
// (gauge 0, one log line naming the missing flags), and reports it on at its next check once an operator sets it.
func TestNotificationsOnReportsOff(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 5)
	f.rdb = testenv.PrivateRedis(t)
	setConfig(t, f.rdb, "notify-keyspace-events", "Ex")
	var logs logLines
	w, reg, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{f.config("1")}, Notifications: true,
		NodeCheckInterval: 50 * time.Millisecond, Logger: logs.logger()})
	testenv.Eventually(t, 10*time.Second, "notifications reported off, naming the missing flags", func() bool {
		return logs.count("keyspace notifications are off in Redis", "missing=eg$") == 1 &&
			counter(t, reg, "keepwarm_warmer_notification_nodes", nil) == 1
	})
	if got := counter(t, reg, "keepwarm_warmer_notifications_enabled", nil); got != 0 || w.NotificationsHealthy() {
		t.Errorf("keepwarm_warmer_notifications_enabled: got %v (healthy %v), want 0", got, w.NotificationsHealthy())
	}
	if got := notifyFlagsOf(t, f.rdb); got != "xE" && got != "Ex" {
		t.Errorf("notify-keyspace-events: got %q, want it left as set (\"Ex\")", got)
	}
	setConfig(t, f.rdb, "notify-keyspace-events", "KEA")
	testenv.Eventually(t, 10*time.Second, "notifications reported on after the operator's CONFIG SET", func() bool {
		return counter(t, reg, "keepwarm_warmer_notifications_enabled", nil) == 1 && logs.count("keyspace notifications are on") == 1
	})
	if n := logs.count("keyspace notifications are off in Redis"); n != 1 {
		t.Errorf("\"notifications are off\" log lines: got %d, want 1 (once per change, not per check)", n)
	}
}

// TestNotificationsAutoDeniedByACL: under an ACL user without +config|set, "auto" cannot set the flags: the daemon
// says so once, reports notifications off, and keeps running.
func TestNotificationsAutoDeniedByACL(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 5)
	admin := testenv.PrivateRedis(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "kwnoset", "on", ">pw", "~*", "&*", "+@all", "-config|set").Err(); err != nil {
		t.Fatal(err)
	}
	opt := *admin.Options()
	opt.Username, opt.Password = "kwnoset", "pw"
	f.rdb = redis.NewClient(&opt)
	t.Cleanup(func() { f.rdb.Close() })
	var logs logLines
	w, reg, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{f.config("1")}, Notifications: true,
		AutoNotifyFlags: true, NodeCheckInterval: 50 * time.Millisecond, Logger: logs.logger()})
	testenv.Eventually(t, 10*time.Second, "the refused CONFIG SET logged", func() bool {
		return logs.count("cannot set notify-keyspace-events", "NOPERM") == 1
	})
	testenv.Eventually(t, 10*time.Second, "pinned key written meanwhile", func() bool {
		return f.rdb.Exists(ctx, f.key("1")).Val() == 1
	})
	if got := counter(t, reg, "keepwarm_warmer_notifications_enabled", nil); got != 0 || w.NotificationsHealthy() {
		t.Errorf("keepwarm_warmer_notifications_enabled: got %v, want 0", got)
	}
	if n := logs.count("cannot set notify-keyspace-events"); n != 1 {
		t.Errorf("refusal logged %d times, want once", n)
	}
}

// TestColdKeyStormWhileLoopBlocked: a storm of writes and deletes of cold keys that match the keyspace's template,
// from several clients, while the keyspace's loop is blocked (as on a Redis call that hangs). The listener drops
// the cold keys' events before they reach the loop; the hot keys' events wait in a bounded queue, coalesced per id,
// and the loop's mailbox holds one message for all of them. After the loop is released the hot keys deleted
// meanwhile are rebuilt on notice. A second storm deletes more hot keys than the queue holds: the overflow is
// counted, and the reconciliation pass it falls back to rebuilds them all within reconcile_every.
func TestColdKeyStormWhileLoopBlocked(t *testing.T) {
	t.Parallel()
	const bound, hot = 8, 20
	f := newFixture(t, hot)
	f.rdb = testenv.PrivateRedis(t)
	setConfig(t, f.rdb, "notify-keyspace-events", "KEA")
	ids := pinnedIDs(hot)
	cfg := f.config(ids...)
	cfg.TTL, cfg.RefreshAhead, cfg.ReconcileEvery = time.Minute, 10*time.Second, 8*time.Second
	w, reg, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Notifications: true,
		NodeCheckInterval: 50 * time.Millisecond, EventQueue: bound})
	ctx := context.Background()
	testenv.Eventually(t, 10*time.Second, "notifications on and every hot key written", func() bool {
		n, _ := f.rdb.Exists(ctx, keysOf(f, ids)...).Result()
		return w.NotificationsHealthy() && n == hot
	})
	labels := map[string]string{"keyspace": "items"}
	overflowAtStart := counter(t, reg, "keepwarm_warmer_notification_overflows_total", labels)
	w.EventQueuePeak("items") // from now on

	// storm runs clients goroutines, each with its own connection, each writing then deleting cold keys, while
	// deleting the hot keys gone (one per client, spread over the storm), and returns the most messages that
	// waited for the loop meanwhile.
	storm := func(gone []string) (maxQueued int) {
		const clients, each = 8, 500
		var wg sync.WaitGroup
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rdb := redis.NewClient(f.rdb.Options())
				defer rdb.Close()
				for i := range each {
					cold := f.key(fmt.Sprintf("cold-%d-%d", c, i%50)) // 50 cold ids per client, rewritten
					if err := rdb.Set(ctx, cold, "x", time.Minute).Err(); err != nil {
						t.Error(err)
						return
					}
					rdb.Del(ctx, cold)
					for j := c; j < len(gone); j += clients {
						if i == each/2 {
							rdb.Del(ctx, f.key(gone[j]))
						}
					}
				}
			}()
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		for {
			maxQueued = max(maxQueued, w.MailboxQueued("items"))
			select {
			case <-done:
				return maxQueued
			case <-time.After(time.Millisecond):
			}
		}
	}
	rebuilt := func(what string, within time.Duration, gone []string) {
		t.Helper()
		testenv.Eventually(t, within, what, func() bool {
			n, _ := f.rdb.Exists(ctx, keysOf(f, gone)...).Result()
			return n == int64(len(gone))
		})
	}

	// 1: fewer hot keys deleted than the queue holds: no overflow; they are rebuilt on notice, long before a
	// reconciliation check could find them.
	release := w.BlockLoop("items")
	t.Cleanup(release) // before the warmer stops
	gone := ids[:5]
	maxQueued := storm(gone)
	peak := w.EventQueuePeak("items")
	cold := counter(t, reg, "keepwarm_warmer_notification_cold_dropped_total", labels)
	t.Logf("storm 1: events queued at peak %d (bound %d), messages waiting for the loop at most %d, cold events dropped %v",
		peak, bound, maxQueued, cold)
	if peak > 5 {
		t.Errorf("events queued at peak: got %d ids, want at most the 5 hot ids deleted (cold ids are dropped)", peak)
	}
	if maxQueued > 3 {
		t.Errorf("messages waiting for the blocked loop: got %d, want at most 3 (one for every event)", maxQueued)
	}
	if cold < 8*500 {
		t.Errorf("keepwarm_warmer_notification_cold_dropped_total: got %v, want at least %d (every cold write)", cold, 8*500)
	}
	if got := counter(t, reg, "keepwarm_warmer_notification_overflows_total", labels); got != overflowAtStart {
		t.Errorf("keepwarm_warmer_notification_overflows_total: got %v, want %v (5 hot ids fit in %d)", got, overflowAtStart, bound)
	}
	release()
	rebuilt("the deleted hot keys rebuilt on notice", 3*time.Second, gone)

	// 2: every hot key deleted, more than the queue holds: the overflow is counted, and the reconciliation pass
	// rebuilds the keys whose events were dropped.
	release = w.BlockLoop("items")
	t.Cleanup(release)
	maxQueued = storm(ids)
	peak = w.EventQueuePeak("items")
	t.Logf("storm 2: events queued at peak %d (bound %d), messages waiting for the loop at most %d", peak, bound, maxQueued)
	if peak > bound {
		t.Errorf("events queued at peak: got %d, want at most %d", peak, bound)
	}
	if got := counter(t, reg, "keepwarm_warmer_notification_overflows_total", labels); got <= overflowAtStart {
		t.Errorf("keepwarm_warmer_notification_overflows_total: got %v, want above %v (%d hot ids deleted, the queue holds %d)",
			got, overflowAtStart, hot, bound)
	}
	release()
	rebuilt("every deleted hot key rebuilt, by notice or by the reconciliation pass", cfg.ReconcileEvery+5*time.Second, ids)
}
