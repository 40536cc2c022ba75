// Package mailbox is how goroutines reach state that one loop owns: a Box[S] holds the state, and the only way to
// touch it is a message, a func(*S) that the box runs on the owner, in the order sent, between the owner's own
// steps. A goroutine that is handed no *S cannot name the state, so "only the loop touches it" is checked by the
// compiler, not agreed in comments. This is the model of robfig/cron's run(): one goroutine owns the entries and
// takes typed requests over a channel, with no lock around the entries.
//
// While no loop owns the box (before Activate, after Deactivate: when in-flight work finishes within a grace
// period after the loop stopped), a message runs at once in the sender's goroutine while the box's lock is held,
// so that at every moment exactly one goroutine touches the state: the owner while active, else the holder of the
// lock. A message must therefore never Send or Call on its own box (the lock is not reentrant).
package mailbox

import (
	"context"
	"sync"
)

// Box is a mailbox for the state S that one loop owns. Its lock, mu, guards the message list and the active flag;
// the state itself is reached only by messages (Send, Call) and by the owner that Activate returns it to.
type Box[S any] struct {
	mu     sync.Mutex
	state  *S
	active bool       // a loop owns the state and drains msgs
	msgs   []func(*S) // sent while active, not yet run
	wake   chan struct{}
}

// New returns a box that owns state. The caller must not keep state: from now on only messages and the owner
// (Activate) reach it.
func New[S any](state *S) *Box[S] {
	return &Box[S]{state: state, wake: make(chan struct{}, 1)}
}

// Send runs fn on the owner without waiting for it: on the loop when active (queued, the loop woken), else at
// once in the caller, under the box's lock.
func (b *Box[S]) Send(fn func(*S)) {
	b.mu.Lock()
	if !b.active {
		defer b.mu.Unlock()
		fn(b.state)
		return
	}
	b.msgs = append(b.msgs, fn)
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// Call runs fn on b's owner and returns what fn returned, or the zero T and ctx.Err() when ctx ends first. fn may
// still run after that, but its result goes to a channel nobody reads: a caller that gave up never sees a late
// result, and shares nothing with fn but what fn's closure captured (which therefore must be only what the loop
// may write, or what the caller no longer reads after an error). It must not be called from the owner itself (the
// owner would wait for itself).
func Call[S, T any](ctx context.Context, b *Box[S], fn func(*S) T) (T, error) {
	done := make(chan T, 1) // buffered: a late fn never blocks the loop
	b.Send(func(s *S) { done <- fn(s) })
	select {
	case v := <-done:
		return v, nil
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// Wake is signalled (buffered, 1) when a message is queued for the owner.
func (b *Box[S]) Wake() <-chan struct{} { return b.wake }

// Activate makes the calling goroutine (the loop) the owner and returns the state for its own steps: from now on
// messages queue for it until Deactivate.
func (b *Box[S]) Activate() *S {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.active = true
	return b.state
}

// Deactivate ends the loop's ownership: the messages still queued run now, under the lock, and later ones run at
// once in their senders. The loop must not touch the state after it.
func (b *Box[S]) Deactivate() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.msgs) > 0 {
		msgs := b.msgs
		b.msgs = nil
		for _, fn := range msgs {
			fn(b.state)
		}
	}
	b.active = false
}

// Drain runs, on the owner, the messages queued so far, in order; it reports how many ran.
func (b *Box[S]) Drain() int {
	b.mu.Lock()
	msgs := b.msgs
	b.msgs = nil
	b.mu.Unlock()
	for _, fn := range msgs {
		fn(b.state)
	}
	return len(msgs)
}

// Queued returns how many messages wait for the owner.
func (b *Box[S]) Queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.msgs)
}

// Do runs fn on b's owner and waits until it ran, or returns ctx.Err() when ctx ends first (fn may still run
// later). It is Call for a message that returns nothing.
func Do[S any](ctx context.Context, b *Box[S], fn func(*S)) error {
	_, err := Call(ctx, b, func(s *S) struct{} {
		fn(s)
		return struct{}{}
	})
	return err
}
