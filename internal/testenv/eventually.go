package testenv

import (
	"testing"
	"time"
)

// PollEvery is how often Poll and Eventually re-check their condition.
const PollEvery = 20 * time.Millisecond

// Poll calls cond every PollEvery until it returns true, and reports whether it did within within. It is for
// tests that wait on an event (a key written, a log line, a metric) rather than sleep a fixed time and count, so
// that they pass on a busy machine; within is only the bound after which the test gives up.
func Poll(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for {
		if cond() {
			return true
		}
		if !time.Now().Before(deadline) {
			return false
		}
		time.Sleep(PollEvery)
	}
}

// Eventually polls cond (see Poll) and fails the test with "<what>: not true within <within>" when it has not
// held within within.
func Eventually(tb testing.TB, within time.Duration, what string, cond func() bool) {
	tb.Helper()
	if !Poll(within, cond) {
		tb.Fatalf("%s: not true within %v", what, within)
	}
}

// EventuallyDiag is Eventually for a condition that can say why it does not hold yet: cond returns whether it
// holds and, when not, a diagnostic (the last value read, the daemon's log). It polls cond every PollEvery and
// fails the test with "<what>: not true within <within>; last: <diagnostic>", the diagnostic of the last call.
func EventuallyDiag(tb testing.TB, within time.Duration, what string, cond func() (ok bool, diag string)) {
	tb.Helper()
	var last string
	if !Poll(within, func() bool {
		ok, diag := cond()
		last = diag
		return ok
	}) {
		tb.Fatalf("%s: not true within %v; last: %s", what, within, last)
	}
}
