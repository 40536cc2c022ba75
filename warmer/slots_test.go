package warmer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// TestOriginSlotsBound checks, with many goroutines, that no more than limit slots are ever held at once, and
// that every waiter gets one in the end.
func TestOriginSlotsBound(t *testing.T) {
	t.Parallel()
	const limit, workers, rounds = 3, 32, 200
	s := newOriginSlots(limit)
	var held, peak atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				if err := s.acquire(context.Background()); err != nil {
					t.Error(err)
					return
				}
				n := held.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				held.Add(-1)
				s.release()
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > limit || p < 1 {
		t.Fatalf("peak slots held = %d, want 1..%d", p, limit)
	}
	if u := s.inUse(); u != 0 {
		t.Fatalf("slots in use after all released = %d, want 0", u)
	}
}

// TestOriginSlotsWaitAndResize checks that a waiter is woken by a release and by a larger limit (no polling: the
// waiter must be blocked until then), that a smaller limit admits nobody until use is below it, and that a
// cancelled wait holds nothing.
func TestOriginSlotsWaitAndResize(t *testing.T) {
	t.Parallel()
	s := newOriginSlots(1)
	if !s.tryAcquire() {
		t.Fatal("tryAcquire on an empty semaphore failed")
	}
	if s.tryAcquire() {
		t.Fatal("tryAcquire past the limit succeeded")
	}
	got := make(chan error, 1)
	go func() { got <- s.acquire(context.Background()) }()
	select {
	case err := <-got:
		t.Fatalf("acquire returned %v while the only slot was held", err)
	default:
	}
	s.setLimit(2) // grows: the waiter gets the new slot
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	s.setLimit(1) // shrinks below use (2): nobody is admitted until use < 1
	s.release()
	if s.tryAcquire() {
		t.Fatal("tryAcquire succeeded with use 1 at limit 1")
	}
	go func() { got <- s.acquire(context.Background()) }()
	s.release() // use 0: the waiter is woken and admitted
	if err := <-got; err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	go func() { got <- s.acquire(ctx) }()
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled acquire = %v, want context.Canceled", err)
	}
	if u := s.inUse(); u != 1 {
		t.Fatalf("slots in use = %d, want 1 (the cancelled wait must hold nothing)", u)
	}
}
