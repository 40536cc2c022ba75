package main

import (
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// notifySocket records what the daemon sends to its NOTIFY_SOCKET.
type notifySocket struct{ *testenv.Notify }

func listenNotify(t *testing.T) notifySocket { return notifySocket{testenv.NotifySocket(t)} }

// index returns the position of the first message starting with prefix, or -1.
func (s notifySocket) index(prefix string) int {
	for i, m := range s.Messages() {
		if strings.HasPrefix(m.Text, prefix) {
			return i
		}
	}
	return -1
}

func (s notifySocket) String() string {
	var texts []string
	for _, m := range s.Messages() {
		texts = append(texts, m.Text)
	}
	return strings.Join(texts, " | ")
}

// TestRunNotifiesSystemd runs the daemon as systemd would with Type=notify and WatchdogSec=5s: READY=1 once
// /readyz passes, watchdog pings while the scheduler runs, STOPPING=1 on SIGTERM.
func TestRunNotifiesSystemd(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	f := newDaemonFixture(t)
	f.write(t, `"1"`, "")
	sd := listenNotify(t)
	t.Setenv("WATCHDOG_USEC", "5000000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	logs, stop := startRun(t, f.path)
	testenv.EventuallyDiag(t, 10*time.Second, "READY=1", withLog(logs, func() bool { return sd.index("READY=1") >= 0 }))
	if m := sd.String(); !strings.Contains(m, "STATUS=running: 1 keyspaces, listening on 127.0.0.1:") {
		t.Errorf("READY carries no STATUS line: %s", m)
	}
	addr := listenAddr(t, logs)
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("after READY=1, /readyz answered %s", resp.Status)
	}
	testenv.EventuallyDiag(t, 5*time.Second, "WATCHDOG=1", withLog(logs, func() bool { return sd.index("WATCHDOG=1") >= 0 }))
	if sd.index("STOPPING=1") >= 0 {
		t.Fatalf("STOPPING=1 before shutdown: %s", sd)
	}
	if code := stop(); code != 0 {
		t.Errorf("exit code %d after SIGTERM\n%s", code, logs)
	}
	// The daemon sent STOPPING=1 before it exited; the test's socket reader may not have read it yet.
	testenv.EventuallyDiag(t, 5*time.Second, "STOPPING=1 received", withLog(logs, func() bool { return sd.index("STOPPING=1") >= 0 }))
	if i, r := sd.index("STOPPING=1"), sd.index("READY=1"); i < r {
		t.Errorf("want STOPPING=1 after READY=1 on shutdown; got %s", sd)
	}
}

// TestRunKeepsRunningWithABadWatchdogSetting: an invalid WATCHDOG_USEC disables the watchdog with one warning; the
// daemon keeps running and exits 0 on SIGTERM (not READY=1 followed by exit 1).
func TestRunKeepsRunningWithABadWatchdogSetting(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	for _, usec := range []string{"0", "soon"} {
		t.Run("WATCHDOG_USEC="+usec, func(t *testing.T) {
			f := newDaemonFixture(t)
			f.write(t, `"1"`, "")
			sd := listenNotify(t)
			t.Setenv("WATCHDOG_USEC", usec)
			t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
			logs, stop := startRun(t, f.path)
			testenv.EventuallyDiag(t, 10*time.Second, "READY=1", withLog(logs, func() bool { return sd.index("READY=1") >= 0 }))
			testenv.EventuallyDiag(t, 5*time.Second, "the warning that the watchdog is disabled", withLog(logs,
				func() bool { return strings.Contains(logs.String(), "systemd watchdog disabled") }))
			addr := listenAddr(t, logs)
			resp, err := http.Get("http://" + addr + "/readyz")
			if err != nil {
				t.Fatalf("/readyz after the warning: %v\n%s", err, logs)
			}
			resp.Body.Close()
			if code := stop(); code != 0 {
				t.Errorf("exit code %d after SIGTERM, want 0\n%s", code, logs)
			}
			if n := strings.Count(logs.String(), "systemd watchdog disabled"); n != 1 {
				t.Errorf("%d warnings that the watchdog is disabled, want 1", n)
			}
			if sd.index("WATCHDOG=1") >= 0 {
				t.Errorf("watchdog pings sent with WATCHDOG_USEC=%s: %s", usec, sd)
			}
		})
	}
}
