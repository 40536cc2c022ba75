package systemd_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/systemd"
	"github.com/keepwarm/keepwarm/internal/testenv"
)

// message is one datagram received on the fake NOTIFY_SOCKET.
type message = testenv.NotifyMessage

// fakeSystemd is a NOTIFY_SOCKET of the test's own (testenv.NotifySocket).
type fakeSystemd struct{ *testenv.Notify }

func listen(t *testing.T) fakeSystemd { return fakeSystemd{testenv.NotifySocket(t)} }

// since returns the messages with text received at or after t.
func (f fakeSystemd) since(t time.Time, text string) []message {
	var out []message
	for _, m := range f.Messages() {
		if !m.At.Before(t) && m.Text == text {
			out = append(out, m)
		}
	}
	return out
}

func (f fakeSystemd) all() []message { return f.Messages() }

func waitMessage(t *testing.T, f fakeSystemd, text string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if len(f.since(time.Time{}, text)) > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	var got []string
	for _, m := range f.all() {
		got = append(got, m.Text)
	}
	t.Fatalf("no %q on NOTIFY_SOCKET within %v; got %q", text, within, got)
}

func TestReadyAndStopping(t *testing.T) {
	f := listen(t)
	for _, tc := range []struct {
		name string
		send func(string) (bool, error)
		want string
	}{
		{"ready", systemd.Ready, "READY=1\nSTATUS=running: 4 keyspaces"},
		{"stopping", systemd.Stopping, "STOPPING=1\nSTATUS=running: 4 keyspaces"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent, err := tc.send("running:\n4 keyspaces") // a newline must not start a new assignment
			if err != nil || !sent {
				t.Fatalf("sent, err = %v, %v; want true, nil", sent, err)
			}
			waitMessage(t, f, tc.want, 2*time.Second)
		})
	}
}

func TestNoNotifySocketIsANoOp(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if sent, err := systemd.Ready(""); sent || err != nil {
		t.Errorf("Ready without NOTIFY_SOCKET: sent, err = %v, %v; want false, nil", sent, err)
	}
}

func TestWatchdogPingsOnlyWhileTheSchedulerProgresses(t *testing.T) {
	f := listen(t)
	t.Setenv("WATCHDOG_USEC", "400000") // WatchdogSec=400ms: a ping every 200ms
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	var frozen atomic.Int64 // unix nanos of the frozen progress; 0 while the scheduler runs
	progress := func() time.Time {
		if n := frozen.Load(); n != 0 {
			return time.Unix(0, n)
		}
		return time.Now()
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- systemd.Watchdog(ctx, progress, nil) }()

	start := time.Now()
	time.Sleep(time.Second)
	if n := len(f.since(start, "WATCHDOG=1")); n < 3 || n > 8 {
		t.Errorf("pings in 1 s with WatchdogSec=400ms while progressing: got %d, want about 5", n)
	}

	// The scheduler wedges: at most one ping may still be on its way (a tick within 200ms of the freeze, plus scheduling slack); none
	// after that.
	freeze := time.Now()
	frozen.Store(freeze.UnixNano())
	time.Sleep(1200 * time.Millisecond)
	if late := f.since(freeze.Add(400*time.Millisecond), "WATCHDOG=1"); len(late) != 0 {
		t.Errorf("%d pings more than 400ms after progress stopped (first %v after); want none",
			len(late), late[0].At.Sub(freeze))
	}

	// Progress again: pings resume within a period.
	resume := time.Now()
	frozen.Store(0)
	time.Sleep(500 * time.Millisecond)
	if n := len(f.since(resume, "WATCHDOG=1")); n < 1 {
		t.Errorf("no ping within 500ms after progress resumed")
	}

	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("Watchdog returned %v after ctx ended; want nil", err)
		}
	case <-time.After(time.Second):
		t.Fatal("Watchdog did not return 1 s after ctx ended")
	}
}

func TestWatchdogDisabled(t *testing.T) {
	listen(t)
	for _, tc := range []struct {
		name, usec, pid string
		warns           bool // one WARN saying the watchdog is disabled
	}{
		{"no WATCHDOG_USEC", "", "", false},
		{"another process's watchdog", "400000", strconv.Itoa(os.Getpid() + 1), false},
		// Issue 22: these made the daemon exit 1 right after READY=1.
		{"malformed WATCHDOG_USEC", "soon", "", true},
		{"WATCHDOG_USEC=0", "0", "", true},
		{"negative WATCHDOG_USEC", "-5", "", true},
		{"malformed WATCHDOG_PID", "400000", "me", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("WATCHDOG_USEC", tc.usec)
			t.Setenv("WATCHDOG_PID", tc.pid)
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			errc := make(chan error, 1)
			go func() { errc <- systemd.Watchdog(context.Background(), time.Now, log) }()
			select {
			case err := <-errc:
				if err != nil {
					t.Errorf("Watchdog: err = %v, want nil: a bad environment disables the watchdog, it does not stop the service", err)
				}
			case <-time.After(time.Second):
				t.Fatal("Watchdog did not return at once with the watchdog off")
			}
			if got := strings.Count(logs.String(), "systemd watchdog disabled"); got != map[bool]int{true: 1}[tc.warns] {
				t.Errorf("%d warnings that the watchdog is disabled, want %d:\n%s", got, map[bool]int{true: 1}[tc.warns], logs.String())
			}
		})
	}
}

func TestWatchdogGivesTheSchedulerAPeriodToStart(t *testing.T) {
	f := listen(t)
	t.Setenv("WATCHDOG_USEC", "400000")
	t.Setenv("WATCHDOG_PID", "")
	never := func() time.Time { return time.Time{} } // a scheduler that never passes
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	go func() { _ = systemd.Watchdog(ctx, never, nil) }()
	time.Sleep(time.Second)
	pings := f.since(start, "WATCHDOG=1")
	if len(pings) < 1 {
		t.Fatal("no ping at start: the scheduler gets one period to make its first pass")
	}
	for _, p := range pings {
		if d := p.At.Sub(start); d > 400*time.Millisecond {
			t.Errorf("ping %v after start with a scheduler that never passed; want none after the first period", d)
		}
	}
}
