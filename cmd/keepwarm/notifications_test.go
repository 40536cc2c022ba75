package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/warmer"
)

func metricsBody(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestRunNotificationsSetting: [redis] notifications (here from KEEPWARM_REDIS_NOTIFICATIONS) reaches the warmer:
// "auto" sets the flags on a Redis that has none and /metrics says notifications are on; "on" leaves them unset
// and says off; "off" does not subscribe at all.
func TestRunNotificationsSetting(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	for _, tt := range []struct {
		setting     string
		wantMetrics []string
		wantFlags   bool
		wantSubs    int64
	}{
		{"auto", []string{"keepwarm_warmer_notifications_enabled 1", "keepwarm_warmer_notification_nodes 1"}, true, 1},
		{"on", []string{"keepwarm_warmer_notifications_enabled 0", "keepwarm_warmer_notification_nodes 1"}, false, 1},
		{"off", []string{"keepwarm_warmer_notifications_enabled 0", "keepwarm_warmer_notification_nodes 0"}, false, 0},
	} {
		t.Run(tt.setting, func(t *testing.T) {
			priv := testenv.PrivateRedis(t)
			ctx := context.Background()
			f := newDaemonFixture(t)
			f.write(t, `"1"`, "")
			t.Setenv("KEEPWARM_REDIS_URL", "redis://"+priv.Options().Addr+"/0")
			t.Setenv("KEEPWARM_REDIS_NOTIFICATIONS", tt.setting)
			logs, stop := startRun(t, f.path)
			addr := listenAddr(t, logs)
			testenv.EventuallyDiag(t, 10*time.Second, "pinned key written", withLog(logs, func() bool { return priv.Exists(ctx, f.prefix+"item:1").Val() == 1 }))
			testenv.EventuallyDiag(t, 10*time.Second, "metrics "+strings.Join(tt.wantMetrics, ", "), withLog(logs, func() bool {
				body := metricsBody(t, addr)
				for _, m := range tt.wantMetrics {
					if !strings.Contains(body, m+"\n") {
						return false
					}
				}
				return true
			}))
			flags := priv.ConfigGet(ctx, "notify-keyspace-events").Val()["notify-keyspace-events"]
			if got := warmer.MissingNotifyFlags(flags) == ""; got != tt.wantFlags {
				t.Errorf("notify-keyspace-events %q: flags set %v, want %v", flags, got, tt.wantFlags)
			}
			ch := "__keyevent@0__:del"
			if got := priv.PubSubNumSub(ctx, ch).Val()[ch]; got != tt.wantSubs {
				t.Errorf("subscribers of %s: got %d, want %d", ch, got, tt.wantSubs)
			}
			if code := stop(); code != 0 {
				t.Errorf("exit code %d\n%s", code, logs)
			}
		})
	}
}
