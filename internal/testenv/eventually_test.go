package testenv_test

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

func TestPoll(t *testing.T) {
	tests := []struct {
		name    string
		trueAt  int64 // the call from which cond holds; 0: never
		within  time.Duration
		want    bool
		atLeast int64 // calls made at least
	}{
		{name: "true at once", trueAt: 1, within: time.Hour, want: true, atLeast: 1},
		{name: "true on the third call", trueAt: 3, within: time.Hour, want: true, atLeast: 3},
		{name: "never true", trueAt: 0, within: 3 * testenv.PollEvery, want: false, atLeast: 2},
		{name: "zero bound still checks once", trueAt: 1, within: 0, want: true, atLeast: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var calls atomic.Int64
			got := testenv.Poll(tt.within, func() bool {
				n := calls.Add(1)
				return tt.trueAt > 0 && n >= tt.trueAt
			})
			if got != tt.want {
				t.Errorf("Poll = %v, want %v", got, tt.want)
			}
			if n := calls.Load(); n < tt.atLeast || (tt.want && n != tt.trueAt) {
				t.Errorf("cond called %d times, want %d", n, max(tt.atLeast, tt.trueAt))
			}
		})
	}
}

func TestEventuallyHolds(t *testing.T) {
	var calls atomic.Int64
	testenv.Eventually(t, time.Hour, "third call", func() bool { return calls.Add(1) >= 3 })
	if n := calls.Load(); n != 3 {
		t.Errorf("cond called %d times, want 3", n)
	}
}

// TestEventuallyDiag: the failure names what was awaited and carries the diagnostic of the last call.
func TestEventuallyDiag(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	testenv.EventuallyDiag(t, time.Hour, "third call", func() (bool, string) {
		n := calls.Add(1)
		return n >= 3, fmt.Sprintf("call %d", n)
	})
	if n := calls.Load(); n != 3 {
		t.Errorf("cond called %d times, want 3", n)
	}
	rec := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() { // Fatalf ends the goroutine, as it ends a test
		defer close(done)
		calls.Store(0)
		testenv.EventuallyDiag(rec, 3*testenv.PollEvery, "never", func() (bool, string) {
			return false, fmt.Sprintf("call %d", calls.Add(1))
		})
	}()
	<-done
	want := fmt.Sprintf("never: not true within %v; last: call %d", 3*testenv.PollEvery, calls.Load())
	if rec.msg != want {
		t.Errorf("failure: got %q, want %q", rec.msg, want)
	}
}

// fatalRecorder records Fatalf's message and ends the calling goroutine, as testing.T's does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
