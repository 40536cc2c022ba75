package mailbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/warmer/internal/mailbox"
)

// state is owned state with no lock of its own: -race reports any second toucher.
type state struct {
	seen []int
	n    int
}

// The box's promise: at every moment one goroutine touches the owned state (the loop while active, else the
// holder of its lock), and messages run in the order each sender sent them.
func TestOneOwnerAndOrder(t *testing.T) {
	t.Parallel()
	b := mailbox.New(&state{})

	// Before a loop owns it, a message runs at once in its sender.
	ran := false
	b.Send(func(s *state) { s.n++; ran = true })
	if !ran {
		t.Fatal("inactive Send did not run at once")
	}

	s := b.Activate()
	if s.n != 1 {
		t.Fatalf("Activate returned a state with n = %d, want 1", s.n)
	}
	stop := make(chan struct{})
	loopDone := make(chan struct{})
	go func() { // the loop: its own steps touch the state too
		defer close(loopDone)
		for {
			select {
			case <-stop:
				b.Deactivate()
				return
			case <-b.Wake():
				b.Drain()
				s.n++ // a loop step between messages
			}
		}
	}()

	const senders, each = 8, 200
	var wg sync.WaitGroup
	for sender := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				v := sender*each + i
				if i%10 == 9 {
					got, err := mailbox.Call(context.Background(), b, func(s *state) int {
						s.seen = append(s.seen, v)
						return v
					})
					if err != nil || got != v {
						t.Errorf("Call = %d, %v, want %d, nil", got, err, v)
					}
					continue
				}
				b.Send(func(s *state) { s.seen = append(s.seen, v) })
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-loopDone

	// After the loop stopped, messages run at once again (a batch settling in the grace period).
	var seen []int
	b.Send(func(s *state) { s.seen = append(s.seen, -1); seen = s.seen })
	if seen[len(seen)-1] != -1 {
		t.Fatal("Send after Deactivate did not run at once")
	}
	seen = seen[:len(seen)-1]
	if len(seen) != senders*each {
		t.Fatalf("%d messages ran, want %d (Deactivate must run what was queued)", len(seen), senders*each)
	}
	last := make(map[int]int)
	for _, v := range seen {
		sender, i := v/each, v%each
		if p, ok := last[sender]; ok && i <= p {
			t.Fatalf("sender %d: message %d ran after %d", sender, i, p)
		}
		last[sender] = i
	}
}

// A call that gives up on its context never sees a late result. The loop is blocked (on a slow Redis, say) while
// the caller's ctx ends; the caller returns with ctx's error and goes on using its result while the loop, now
// unblocked, runs the message, which writes the owned state and returns a slice of it. Nothing orders the two, so
// under -race any memory they share is reported: a result variable that the message fills in (a closure over the
// caller's `out`, as the old mailbox's call had) fails this test. The caller's result must also be the zero value
// with the context's error, not what the message wrote.
func TestCallAfterContextSeesNoLateResult(t *testing.T) {
	t.Parallel()
	b := mailbox.New(&state{})
	s := b.Activate()
	release, ran, loopDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() { // the loop, blocked until release
		defer close(loopDone)
		<-release
		for b.Drain() == 0 {
			<-b.Wake()
		}
		s.n++
	}()

	ctx, cancel := context.WithCancel(context.Background())
	returned := make(chan struct{})
	type result struct {
		got []int
		err error
	}
	done := make(chan result)
	go func() { // the caller
		got, err := mailbox.Call(ctx, b, func(s *state) []int {
			for i := range 100 {
				s.seen = append(s.seen, i)
			}
			close(ran)
			return s.seen
		})
		close(returned)
		time.Sleep(20 * time.Millisecond) // the message runs meanwhile, unordered with what follows
		got = append(got, -1)             // the caller uses its result
		done <- result{got, err}
	}()
	for b.Queued() == 0 { // the message is queued before ctx ends
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-returned
	close(release) // the loop runs the message after the call returned
	r := <-done
	<-ran
	<-loopDone
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("Call = %v, want context.Canceled", r.err)
	}
	if len(r.got) != 1 || r.got[0] != -1 {
		t.Fatalf("caller's result = %v, want only its own [-1]: the late message's result leaked", r.got)
	}
	if len(s.seen) != 100 {
		t.Fatalf("state has %d entries, want 100 (the message still ran, on the loop)", len(s.seen))
	}
	b.Deactivate()
}

// A call whose context ends before the loop runs it returns the context's error and does not block the caller;
// Deactivate runs what was queued.
func TestCallHonoursContext(t *testing.T) {
	t.Parallel()
	b := mailbox.New(&state{})
	b.Activate() // no loop drains it
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := mailbox.Do(ctx, b, func(s *state) { s.n = 1 }); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do = %v, want context.DeadlineExceeded", err)
	}
	b.Deactivate() // runs the queued message, here
	n := 0
	b.Send(func(s *state) { n = s.n })
	if n != 1 {
		t.Fatal("Deactivate did not run the message queued before it")
	}
}
