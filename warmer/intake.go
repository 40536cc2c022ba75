package warmer

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultEventQueue is the default Config.EventQueue: how many hot ids may have keyspace-notification events
// waiting for one keyspace's loop. A waiting id costs about 100 bytes (its map entry and id), so the queue stays
// under about 1 MB per keyspace. Only hot ids are queued and each id once (its events coalesce), so the queue can
// only fill when more than this many hot keys change while the loop is busy (a Redis call hanging, a mass expiry
// of a large hot set); the reconciliation pass it falls back to then re-reads them within the PTTL budget.
const DefaultEventQueue = 10000

// intake is a keyspace's queue of keyspace-notification events, between the listener and the loop. The listener
// drops events for cold ids before they reach it (hotIDSet), so what waits is bounded by the hot set, and events for
// one id coalesce into one entry; the loop takes the whole queue with one message (takeEvents), so the mailbox
// holds at most one intake message at a time, however many events arrive. When limit ids wait already, an event
// for another id is dropped and counted (keepwarm_warmer_notification_overflows_total), and the loop falls back to
// a reconciliation pass over the whole hot set (overflowed).
type intake struct {
	mu       sync.Mutex // guards every field below
	pending  map[string]*heardEvents
	limit    int
	queued   bool // a takeEvents message is on its way to the loop
	overflow bool // events were dropped since the loop last took the queue
	peak     int  // the most ids that waited at once (for tests, which reset it)
}

// heardEvents are the events heard for one id since the loop last took the queue, coalesced: what the loop does
// for each kind does not depend on how often it came, except for "set" (the first after the daemon's own write is
// that write's; see event) and the evictions counted.
type heardEvents struct {
	sets    uint8 // "set" events, at most 2
	expired bool
	del     bool
	evicted int
}

// add records event for id. It reports whether the loop must be sent a takeEvents message (the first event
// since the last take), and whether the event was dropped because limit ids wait already.
func (in *intake) add(event, id string) (send, dropped bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	e := in.pending[id]
	if e == nil {
		if len(in.pending) >= in.limit {
			in.overflow = true
			return false, true
		}
		if in.pending == nil {
			in.pending = make(map[string]*heardEvents)
		}
		e = &heardEvents{}
		in.pending[id] = e
		in.peak = max(in.peak, len(in.pending))
	}
	switch event {
	case "set":
		e.sets = min(e.sets+1, 2)
	case "expired":
		e.expired = true
	case "del":
		e.del = true
	case "evicted":
		e.evicted++
	}
	send = !in.queued
	in.queued = true
	return send, false
}

// take empties the queue for the loop and reports whether events were dropped since the last take.
func (in *intake) take() (pending map[string]*heardEvents, overflow bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	pending, overflow = in.pending, in.overflow
	in.pending, in.overflow, in.queued = nil, false, false
	return pending, overflow
}

// hotIDSet is the set of a keyspace's hot ids as its loop last published it (keyspace.hot): immutable once stored.
type hotIDSet map[string]struct{}

// isHot reports whether id was hot when the loop last published its hot set.
func (k *keyspace) isHot(id string) bool {
	hot := k.hot.Load()
	if hot == nil {
		return false
	}
	_, ok := (*hot)[id]
	return ok
}

// publishHot publishes the hot ids for the listener (isHot); setHot calls it after each change.
func (k *loopState) publishHot() {
	hot := make(hotIDSet, len(k.hotSet))
	for id := range k.hotSet {
		hot[id] = struct{}{}
	}
	k.hot.Store(&hot)
}

// takeEvents is the intake's message, on the loop: it runs the coalesced events of each id, and after an overflow
// falls back to reconciliation.
func (k *loopState) takeEvents() {
	pending, overflow := k.intake.take()
	for id, e := range pending {
		for range e.sets {
			k.event("set", id, 1)
		}
		// The gone events last, an invalidation (del) after an expiry: the app meant the key gone.
		if e.expired {
			k.event("expired", id, 1)
		}
		if e.evicted > 0 {
			k.event("evicted", id, e.evicted)
		}
		if e.del {
			k.event("del", id, 1)
		}
	}
	if overflow {
		k.overflowed()
	}
}

// overflowed is the fallback after the intake dropped events: any hot key may have been rewritten, deleted or
// evicted unannounced, so none is trusted any more, and every one is re-checked with PTTL within one
// reconcile_every, spread over it, as after a lost subscription (reconcile).
func (k *loopState) overflowed() {
	for _, h := range k.hotSet {
		h.ownWrite = false
	}
	k.recheckAll(k.w.now())
}

// intakeMetrics are the intake's metrics.
type intakeMetrics struct {
	cold     *prometheus.CounterVec // keyspace: events for cold ids, dropped by the listener
	overflow *prometheus.CounterVec // keyspace: events dropped because the queue was full
}

func newIntakeMetrics() intakeMetrics {
	return intakeMetrics{
		cold: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_notification_cold_dropped_total",
			Help: "Keyspace-notification events for cold ids (not in the hot set), dropped by the listener before they reach the keyspace's loop.",
		}, []string{"keyspace"}),
		overflow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_notification_overflows_total",
			Help: "Keyspace-notification events for hot ids dropped because the keyspace's event queue was full (event_queue ids wait already); every hot key is then re-checked by the reconciliation within one reconcile_every.",
		}, []string{"keyspace"}),
	}
}

func (m intakeMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.cold, m.overflow}
}
