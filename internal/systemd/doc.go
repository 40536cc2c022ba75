// Package systemd tells systemd how the daemon is doing, through the sd_notify protocol (sd_notify(3)) as
// coreos/go-systemd's daemon package speaks it:
//
//   - READY=1 once the config is loaded and Redis and PostgreSQL have answered: with Type=notify, `systemctl
//     start keepwarm` returns only then, and units ordered After=keepwarm.service start only then.
//   - STOPPING=1 as soon as shutdown begins (SIGTERM), before in-flight refreshes are drained.
//   - WATCHDOG=1 every WatchdogSec/2, but only while the warmer's scheduler is making progress: a ping is sent
//     only if the scheduler completed a loop pass within the last WatchdogSec/2. A wedged scheduler stops the
//     pings, and systemd kills and restarts the daemon (WatchdogSec=, Restart=on-failure).
//
// Without $NOTIFY_SOCKET (not under systemd, or a unit that is not Type=notify) every call is a no-op, and without
// $WATCHDOG_USEC (no WatchdogSec=) Watchdog returns at once. deploy/systemd/keepwarm.service is the unit.
package systemd
