package systemd_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
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
	testenv.EventuallyDiag(t, within, fmt.Sprintf("%q on NOTIFY_SOCKET", text), func() (bool, string) {
		var got []string
		for _, m := range f.all() {
			got = append(got, m.Text)
		}
		return len(f.since(time.Time{}, text)) > 0, fmt.Sprintf("got %q", got)
	})
}

// progressCalls records when Watchdog called its progress function: once per tick, so the test can pace itself
// by the watchdog's own ticks instead of by the wall clock.
type progressCalls struct {
	mu sync.Mutex
	at []time.Time
}

func (p *progressCalls) record() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.at = append(p.at, time.Now())
}

// after returns the times of the calls later than t.
func (p *progressCalls) after(t time.Time) []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []time.Time
	for _, a := range p.at {
		if a.After(t) {
			out = append(out, a)
		}
	}
	return out
}

// noPingsAfterWithheld waits until Watchdog has looked at progress four times when the last progress was more
// than a period old (so it must have withheld the ping on each of those ticks), then fails if any ping arrived
// after the second of them. The first such tick is left out as a margin: the ping of the tick before it may be
// read by the fake socket a little late. The wait is bounded by the watchdog's ticks, not a fixed time.
func noPingsAfterWithheld(t *testing.T, f fakeSystemd, calls *progressCalls, last time.Time, period time.Duration, what string) {
	t.Helper()
	var withheld []time.Time
	testenv.EventuallyDiag(t, 10*period+2*time.Second, what+": four ticks that must withhold the ping", func() (bool, string) {
		withheld = calls.after(last.Add(period))
		return len(withheld) >= 4, fmt.Sprintf("%d such ticks", len(withheld))
	})
	if late := f.since(withheld[1], "WATCHDOG=1"); len(late) != 0 {
		t.Errorf("%s: %d pings on ticks more than a period (%v) after the last progress (first %v after it); want none",
			what, len(late), period, late[0].At.Sub(last))
	}
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
	const period = 200 * time.Millisecond
	var frozen atomic.Int64 // unix nanos of the frozen progress; 0 while the scheduler runs
	var calls progressCalls
	progress := func() time.Time {
		calls.record()
		if n := frozen.Load(); n != 0 {
			return time.Unix(0, n)
		}
		return time.Now()
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- systemd.Watchdog(ctx, progress, nil) }()

	// While progressing: a ping on every tick. Wait for six, then check their pace on average: between half a
	// period and two periods apart. The times are when the test read each ping, so one pair can arrive closer on a
	// loaded machine (70 ms apart once beside stress-ng) though sent a period apart; a ping on every progress
	// call instead of every tick would be far faster on average.
	var pings []message
	testenv.EventuallyDiag(t, 5*time.Second, "six pings while progressing", func() (bool, string) {
		pings = f.since(start, "WATCHDOG=1")
		return len(pings) >= 6, fmt.Sprintf("%d pings", len(pings))
	})
	if avg := pings[len(pings)-1].At.Sub(pings[0].At) / time.Duration(len(pings)-1); avg < period/2 || avg > 2*period {
		t.Errorf("%d pings %v apart on average with WatchdogSec=400ms, want about %v", len(pings), avg, period)
	}

	// The scheduler wedges: the ticks within a period of the freeze may still ping; none after that.
	freeze := time.Now()
	frozen.Store(freeze.UnixNano())
	noPingsAfterWithheld(t, f, &calls, freeze, period, "progress frozen")

	// Progress again: pings resume.
	resume := time.Now()
	frozen.Store(0)
	testenv.Eventually(t, 5*time.Second, "a ping after progress resumed", func() bool {
		return len(f.since(resume, "WATCHDOG=1")) >= 1
	})

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
		// Each of these must not make the daemon exit 1 right after READY=1.
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
	const period = 200 * time.Millisecond
	var calls progressCalls
	never := func() time.Time { calls.record(); return time.Time{} } // a scheduler that never passes
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	go func() { _ = systemd.Watchdog(ctx, never, nil) }()
	testenv.Eventually(t, 5*time.Second, "a ping at start: the scheduler gets one period to make its first pass", func() bool {
		return len(f.since(start, "WATCHDOG=1")) >= 1
	})
	// The watchdog's period counts from its first look at progress, which is no earlier than that first call.
	var first []time.Time
	testenv.Eventually(t, 5*time.Second, "the watchdog looked at progress", func() bool {
		first = calls.after(start)
		return len(first) >= 1
	})
	noPingsAfterWithheld(t, f, &calls, first[0], period, "scheduler never passed")
}
