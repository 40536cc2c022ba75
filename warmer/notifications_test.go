package warmer_test

import (
	"context"
	"strings"
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
			logs.count("re-subscribed after a lost connection") >= 1
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
