package warmer

import (
	"testing"
	"time"
)

// Flapping failures are one outage: one "begins", and one "ends" once outageSettle has passed without failures.
func TestOutageLogsOncePerOutage(t *testing.T) {
	t.Parallel()
	var o outage
	t0 := time.Unix(1000, 0)
	begins, ends := 0, 0
	for i := 0; i < 30; i++ { // a failure every other second, a success in between: flapping for a minute
		at := t0.Add(time.Duration(2*i) * time.Second)
		if o.fail(at, 1) {
			begins++
		}
		if e, _ := o.ok(at.Add(time.Second)); e {
			ends++
		}
	}
	if begins != 1 || ends != 0 {
		t.Fatalf("while flapping: begins %d, ends %d; want 1 and 0", begins, ends)
	}
	last := t0.Add(58 * time.Second)
	if e, _ := o.ok(last.Add(outageSettle - time.Millisecond)); e {
		t.Fatal("ended before outageSettle had passed since the last failure")
	}
	if e, n := o.ok(last.Add(outageSettle)); !e || n != 30 {
		t.Fatalf("ok after outageSettle: ends %v with %d failures; want true, 30", e, n)
	}
	if !o.fail(last.Add(time.Hour), 1) {
		t.Error("a failure after the outage ended does not begin a new one")
	}
}

// An outage that needs two failures in a row (an origin timeout) does not begin at one failure followed by a
// success, and begins at the second of two in a row.
func TestOutageNeedsStreak(t *testing.T) {
	t.Parallel()
	var o outage
	t0 := time.Unix(1000, 0)
	if o.fail(t0, 2) {
		t.Fatal("one failure began an outage that needs two in a row")
	}
	o.ok(t0.Add(time.Second))
	if o.fail(t0.Add(2*time.Second), 2) {
		t.Fatal("a failure after a success began an outage that needs two in a row")
	}
	if !o.fail(t0.Add(3*time.Second), 2) {
		t.Fatal("the second failure in a row did not begin the outage")
	}
	if !o.ongoing() {
		t.Fatal("ongoing() = false during an outage")
	}
}
