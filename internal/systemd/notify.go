package systemd

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Ready sends READY=1 and, when status is not empty, a STATUS= line that `systemctl status` shows. It reports
// whether a notification was sent (false when $NOTIFY_SOCKET is unset) and any error writing to the socket.
func Ready(status string) (bool, error) { return notify(daemon.SdNotifyReady, status) }

// Stopping sends STOPPING=1 (and STATUS=, when not empty): shutdown has begun.
func Stopping(status string) (bool, error) { return notify(daemon.SdNotifyStopping, status) }

func notify(state, status string) (bool, error) {
	if status != "" {
		// One datagram, newline-separated assignments; a newline inside the status would start a new one.
		state += "\nSTATUS=" + strings.ReplaceAll(status, "\n", " ")
	}
	sent, err := daemon.SdNotify(false, state)
	if err != nil {
		return sent, fmt.Errorf("systemd: notify %s: %w", strings.SplitN(state, "\n", 2)[0], err)
	}
	return sent, nil
}

// Watchdog pings systemd's watchdog (WATCHDOG=1) every interval/2 until ctx ends, where interval is
// $WATCHDOG_USEC (the unit's WatchdogSec=). A ping is sent only if progress() is within interval/2 of now:
// progress returns when the scheduler last completed a loop pass (warmer.Warmer.Progress), so a wedged
// scheduler stops the pings and systemd restarts the daemon within 1.5 × WatchdogSec of the last pass. The
// scheduler passes at least every poll interval (about 2 s), so WatchdogSec should be 10 s or more.
//
// It returns nil at once when the watchdog is not enabled (no $WATCHDOG_USEC, or $WATCHDOG_PID names another
// process), and nil when ctx ends. A $WATCHDOG_USEC that is not a positive number, or a $WATCHDOG_PID that is
// not a number, disables the watchdog with one WARN line: the service keeps running without pings rather than
// stopping on a bad environment (WATCHDOG_USEC=0 would otherwise make it exit 1 right after READY=1). The
// scheduler has interval/2 from the call to make its first pass. Socket errors are logged, not returned: a
// missed ping is systemd's to judge. log defaults to slog.Default().
func Watchdog(ctx context.Context, progress func() time.Time, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		log.Warn("systemd watchdog disabled: invalid WATCHDOG_USEC or WATCHDOG_PID in the environment (set WatchdogSec= in the unit instead of these variables)",
			"error", err, "WATCHDOG_USEC", os.Getenv("WATCHDOG_USEC"), "WATCHDOG_PID", os.Getenv("WATCHDOG_PID"))
		return nil
	}
	if interval <= 0 {
		return nil
	}
	period := interval / 2
	log.Info("systemd watchdog enabled", "watchdog_sec", interval, "ping_every", period)
	tick := time.NewTicker(period)
	defer tick.Stop()
	stalled := false
	// The scheduler gets one period from now to make its first pass: a progress older than the watchdog's own
	// start counts from the start.
	start := time.Now()
	for {
		last := progress()
		if last.Before(start) {
			last = start
		}
		// A negative age (the wall clock stepped back) counts as progress.
		if age := time.Since(last); age <= period {
			if stalled {
				log.Info("scheduler progressing again; resuming systemd watchdog pings")
				stalled = false
			}
			if _, err := daemon.SdNotify(false, daemon.SdNotifyWatchdog); err != nil {
				log.Warn("systemd watchdog ping failed", "error", err)
			}
		} else if !stalled {
			stalled = true
			log.Error("scheduler made no progress; withholding systemd watchdog pings (systemd will restart keepwarm)",
				"last_progress_ago", age.Round(time.Millisecond), "watchdog_sec", interval)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
