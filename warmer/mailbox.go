package warmer

import (
	"context"
	"sync"
)

// mailbox is how every goroutine other than a keyspace's scheduler loop reaches the keyspace's state: refresh
// batches hand back what they settled, the notification listener its events, the fleet heartbeat its views, the
// change stream its requests, Status its snapshot request. Each is a message (a func) that runs on the loop, in
// the order sent, between the loop's own steps. This is the model of robfig/cron's run(): one goroutine owns the
// entries and takes requests over a channel, with no lock around the entries.
//
// Its one lock, mu, guards the message list and the active flag only, with one exception that keeps the model
// total: while no loop owns the keyspace (before Run starts it, after it stopped, which is when in-flight batches
// finish within the grace period and a stopped keyspace's last settles arrive), a message runs at once in the
// sender's goroutine while mu is held, so that at every moment exactly one goroutine touches the state: the loop
// while active, else the holder of mu. A message must therefore never send or call itself (mu is not reentrant);
// poke is fine.
type mailbox struct {
	mu     sync.Mutex
	active bool     // a loop owns the state and drains msgs
	msgs   []func() // sent while active, not yet run
	wake   chan struct{}
}

func newMailbox() *mailbox { return &mailbox{wake: make(chan struct{}, 1)} }

// send runs fn on the owner without waiting for it: on the loop when active (queued, the loop woken), else at
// once under mu.
func (m *mailbox) send(fn func()) {
	m.mu.Lock()
	if !m.active {
		defer m.mu.Unlock()
		fn()
		return
	}
	m.msgs = append(m.msgs, fn)
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// call runs fn on the owner and waits until it ran, or until ctx ends (ctx.Err() is returned; fn may still run
// later, so it must only write what the caller no longer reads after an error). It must not be called from the
// loop itself (the loop would wait for itself).
func (m *mailbox) call(ctx context.Context, fn func()) error {
	done := make(chan struct{})
	m.send(func() {
		fn()
		close(done)
	})
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// activate makes the calling goroutine (the loop) the owner: from now on messages queue for it.
func (m *mailbox) activate() {
	m.mu.Lock()
	m.active = true
	m.mu.Unlock()
}

// deactivate ends the loop's ownership: the messages still queued run now, under mu, and later ones run at once
// in their senders (see mailbox).
func (m *mailbox) deactivate() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for len(m.msgs) > 0 {
		msgs := m.msgs
		m.msgs = nil
		for _, fn := range msgs {
			fn()
		}
	}
	m.active = false
}

// drain runs, on the loop, the messages queued so far, in order; it reports how many ran.
func (m *mailbox) drain() int {
	m.mu.Lock()
	msgs := m.msgs
	m.msgs = nil
	m.mu.Unlock()
	for _, fn := range msgs {
		fn()
	}
	return len(msgs)
}
