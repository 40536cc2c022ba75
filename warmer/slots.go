package warmer

import (
	"context"
	"sync"
)

// originSlots is a counting semaphore over a keyspace's origin concurrency (max_origin_concurrency): the
// daemon's refresh batches and warmup batches each hold one slot while they run, so that together they never
// run more origin queries at once than the limit. Unlike golang.org/x/sync/semaphore.Weighted its limit can
// change while slots are held (a reload): a lower limit lets held slots finish and admits nobody until use is
// below it. Waiters block on a channel that is closed whenever a slot frees or the limit grows; nothing polls.
// Safe for concurrent use.
type originSlots struct {
	mu    sync.Mutex
	limit int           // slots in all (≥ 1)
	used  int           // slots held
	freed chan struct{} // closed and replaced when a slot frees or the limit grows
}

func newOriginSlots(limit int) *originSlots {
	return &originSlots{limit: max(limit, 1), freed: make(chan struct{})}
}

// tryAcquire takes a slot if one is free, without waiting, and reports whether it did.
func (s *originSlots) tryAcquire() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used >= s.limit {
		return false
	}
	s.used++
	return true
}

// acquire takes a slot, waiting until one is free. It returns ctx.Err() if ctx ends first, holding nothing.
func (s *originSlots) acquire(ctx context.Context) error {
	for {
		s.mu.Lock()
		if s.used < s.limit {
			s.used++
			s.mu.Unlock()
			return nil
		}
		freed := s.freed
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-freed:
		}
	}
}

// release returns a slot taken by tryAcquire or acquire.
func (s *originSlots) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.used--
	s.wakeLocked()
}

// setLimit changes the number of slots (values below 1 mean 1).
func (s *originSlots) setLimit(limit int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	grew := limit > s.limit
	s.limit = max(limit, 1)
	if grew {
		s.wakeLocked()
	}
}

// inUse is the number of slots held.
func (s *originSlots) inUse() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

func (s *originSlots) wakeLocked() {
	close(s.freed)
	s.freed = make(chan struct{})
}
