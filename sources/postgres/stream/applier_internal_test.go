package stream

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// TestApplyLoopAcksOnlyApplied: the applier takes transactions over its channel while a batch is being applied
// (the receive loop never waits on apply), and the acknowledged LSN reaches a transaction's End only once apply
// returned nil for it: not while apply runs, not when it fails.
func TestApplyLoopAcksOnlyApplied(t *testing.T) {
	t.Parallel()
	s, err := New(Config{DSN: "postgres://x@127.0.0.1:1/x", Gather: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	calls := make(chan []Txn)   // each call of apply, as it starts
	results := make(chan error) // what that call returns
	apply := func(_ context.Context, b []Txn) error { calls <- b; return <-results }
	txns := make(chan Txn)
	done := make(chan error, 1)
	go func() { done <- s.applyLoop(ctx, txns, apply) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("applyLoop: %v", err)
		}
	}()
	acked := func() pglogrepl.LSN {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.acked
	}
	now := time.Now()
	txns <- Txn{End: 100, received: now}
	if b := <-calls; len(b) != 1 || b[0].End != 100 {
		t.Fatalf("first batch: %+v, want the transaction ending at 100", b)
	}
	// While apply runs, two more transactions are taken at once.
	txns <- Txn{End: 200, received: now}
	txns <- Txn{End: 300, received: now}
	if got := acked(); got != 0 {
		t.Errorf("acked while the first batch is applied: %v, want 0", got)
	}
	testenv.Eventually(t, 5*time.Second, "3 transactions pending", func() bool { return s.Status().Pending == 3 })
	results <- errors.New("origin down")
	// Offered again with what arrived since; still nothing acknowledged.
	if b := <-calls; len(b) != 3 || b[2].End != 300 {
		t.Fatalf("retried batch: %+v, want the three transactions", b)
	}
	if got := acked(); got != 0 {
		t.Errorf("acked after a failed apply: %v, want 0", got)
	}
	results <- nil
	testenv.Eventually(t, 5*time.Second, "acked 300 after the batch applied", func() bool { return acked() == 300 })
	if st := s.Status(); st.Pending != 0 {
		t.Errorf("pending after the batch: %d, want 0", st.Pending)
	}
}

// TestNextAttempt: the reconnect back-off starts over after a session that applied something or lasted a
// minute, and keeps growing while sessions fail before they apply anything (PostgreSQL down, a slot refused).
func TestNextAttempt(t *testing.T) {
	tests := []struct {
		name    string
		attempt int
		lasted  time.Duration
		applied int64
		want    int
	}{
		{"connect failed during an outage: keep growing", 4, 10 * time.Millisecond, 0, 4},
		{"streamed 19 s and applied, then failed: start over", 5, 19 * time.Second, 120, 0},
		{"streamed a minute without a change: start over", 5, 61 * time.Second, 0, 0},
		{"failed at once without applying: keep growing", 2, 2 * time.Second, 0, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := nextAttempt(tt.attempt, tt.lasted, tt.applied); got != tt.want {
				t.Errorf("got %d, want %d", got, tt.want)
			}
		})
	}
}
