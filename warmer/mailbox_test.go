package warmer

import (
	"context"
	"sync"
	"testing"
	"time"
)

// The mailbox's promise: at every moment one goroutine touches the owned state (the loop while active, else the
// holder of its lock), and messages run in the order each sender sent them. The state here is a plain slice and
// counter with no lock of their own: -race reports any second toucher.
func TestMailboxOneOwnerAndOrder(t *testing.T) {
	m := newMailbox()
	var seen []int // owned state
	n := 0         // owned state

	// Before a loop owns it, a message runs at once in its sender.
	m.send(func() { n++ })
	if n != 1 {
		t.Fatalf("inactive send did not run at once: n = %d", n)
	}

	m.activate()
	stop := make(chan struct{})
	loopDone := make(chan struct{})
	go func() { // the loop: its own steps touch the state too
		defer close(loopDone)
		for {
			select {
			case <-stop:
				m.deactivate()
				return
			case <-m.wake:
				m.drain()
				n++ // a loop step between messages
			}
		}
	}()

	const senders, each = 8, 200
	var wg sync.WaitGroup
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if i%10 == 9 {
					if err := m.call(context.Background(), func() { seen = append(seen, s*each+i) }); err != nil {
						t.Error(err)
					}
					continue
				}
				m.send(func() { seen = append(seen, s*each+i) })
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-loopDone

	// After the loop stopped, messages run at once again (a batch settling in the grace period).
	m.send(func() { seen = append(seen, -1) })
	if seen[len(seen)-1] != -1 {
		t.Fatal("send after deactivate did not run at once")
	}
	seen = seen[:len(seen)-1]
	if len(seen) != senders*each {
		t.Fatalf("%d messages ran, want %d (deactivate must run what was queued)", len(seen), senders*each)
	}
	last := make(map[int]int)
	for _, v := range seen {
		s, i := v/each, v%each
		if p, ok := last[s]; ok && i <= p {
			t.Fatalf("sender %d: message %d ran after %d", s, i, p)
		}
		last[s] = i
	}
}

// A call whose context ends before the loop runs it returns the context's error and does not block the caller.
func TestMailboxCallHonoursContext(t *testing.T) {
	m := newMailbox()
	m.activate() // no loop drains it
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	queued := false
	if err := m.call(ctx, func() { queued = true }); err != context.DeadlineExceeded {
		t.Fatalf("call = %v, want context.DeadlineExceeded", err)
	}
	m.deactivate() // runs the queued message, here
	if !queued {
		t.Fatal("deactivate did not run the message queued before it")
	}
	ran := false
	m.send(func() { ran = true })
	if !ran {
		t.Fatal("send after deactivate did not run")
	}
}
