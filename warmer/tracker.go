package warmer

import (
	"slices"
	"time"
)

// entry is one tracked id. Cold entries cost only this struct and the map slot; hot ones also carry a hotState.
// The tracked set is bounded by MaxTracked; when it is full the coldest entry leaves first. The fields are laid
// out so that an entry is 32 bytes (see selection.go for what reads, lfu and flags mean).
type entry struct {
	score  float64    // the access set's decayed score at the last poll that read the id
	seen   int64      // unix seconds of the last poll that saw the id in a signal
	hot    *hotState  // non-nil while the id is hot
	mark   uint32     // tracker.gen of the last selectHot that took this entry as a candidate
	lfu    uint8      // Redis's LFU counter above lfuInitVal at the last scan that saw the key; 0 when none
	wasted uint8      // refreshes in a row that no read followed (the refresh feedback); saturates at 255
	flags  entryFlags // admission and refresh-feedback state, and the reads seen
	pinned bool
}

// hotState is the refresh state of a hot key.
type hotState struct {
	id  string
	e   *entry
	idx int       // position in the due queue, -1 when not queued
	due time.Time // when the next refresh is due

	expiry      time.Time     // best known expiry of the cache key; zero when unknown or missing
	learnedAt   time.Time     // when the value of that expiry was written by the daemon, or first seen
	needPTTL    bool          // the expiry must be (re)learnt with PTTL before the key is scheduled
	goneEvent   string        // with needPTTL: the expired, evicted or del event that asked for the PTTL (see onEvent)
	persistent  bool          // PTTL −1: the key has no TTL; it is reported and never overwritten
	inflight    bool          // a refresh batch holds this key
	missing     bool          // the origin had no row at the last refresh
	lastRebuild time.Duration // duration of the last successful rebuild (origin query)
	rebuildP95  time.Duration // decayed-maximum estimate of the rebuild p95
	lastRefresh time.Time
	lastErr     string
	errors      int       // consecutive failed refreshes, for back-off
	staleSince  time.Time // when the fail-safe first kept this value past its TTL, in the current outage
	counted     bool      // this expiry was already counted as an SLO miss (re-armed by each new value learnt)
	shortNotice bool      // the expiry was learnt less than one lead before it (a breakdown of misses, not an exemption)
	invalidated bool      // the current absence is an invalidation (a del event, or lock_gone): not an SLO miss
	pendingGone string    // a gone event (expired, evicted, del) that arrived while a refresh was in flight
	handover    bool      // adopted from another fleet replica; its first PTTL reading may be an SLO miss
	hotSince    time.Time // when the id became hot
	// flushedSince is, while a flush's re-read of the key is pending (rereadAll), the moment since which Redis is
	// known emptied (the flush canary's last write); zero otherwise.
	flushedSince time.Time
	missedAt     time.Time // when this key's last SLO miss was counted (countMissLocked)

	// Reconciliation (reconcile.go).
	cidx        int       // position in the check queue, -1 when not queued
	checkAt     time.Time // when its PTTL is next re-checked
	ownWrite    bool      // the current value is the daemon's own write, so its expiry is known
	notifyEpoch uint64    // trustState.epoch when ownWrite was last confirmed: trusted while it is current
	ownSetUntil time.Time // until then, the first "set" notification is the own write's (see ownSetWindow)
	writes      uint32    // the daemon's writes of this key so far: a PTTL read before the latest one is stale
}

// observeRebuild folds d into the key's rebuild estimate: it rises at once to a slower rebuild and decays by 1/16
// of the gap on a faster one, a cheap upper-quantile tracker that needs no per-key sample buffer.
func (h *hotState) observeRebuild(d time.Duration) {
	h.lastRebuild = d
	if d >= h.rebuildP95 {
		h.rebuildP95 = d
		return
	}
	h.rebuildP95 -= (h.rebuildP95 - d) / 16
}

// tracker holds one keyspace's tracked ids. It is not safe for concurrent use: the keyspace's mutex guards it.
type tracker struct {
	entries  map[string]*entry
	pinned   map[string]bool
	max      int
	gen      uint32        // bumped by each selectHot, to skip duplicate candidates without a set of its own
	halfLife time.Duration // decay_half_life: how fast an id's score fades once no signal names it any more
}

func newTracker(maxTracked int, halfLife time.Duration) *tracker {
	return &tracker{entries: make(map[string]*entry), pinned: make(map[string]bool), max: maxTracked, halfLife: halfLife}
}

// setPinned replaces the set of pinned ids. It returns the entries that are no longer pinned.
func (t *tracker) setPinned(ids []string, now int64) (unpinned []string) {
	next := make(map[string]bool, len(ids))
	for _, id := range ids {
		next[id] = true
		e := t.entries[id]
		if e == nil {
			e = &entry{seen: now}
			t.entries[id] = e
		}
		e.pinned = true
	}
	for id := range t.pinned {
		if !next[id] {
			if e := t.entries[id]; e != nil {
				e.pinned = false
			}
			unpinned = append(unpinned, id)
		}
	}
	t.pinned = next
	return unpinned
}

// trim drops the coldest entries beyond the bound; pinned and hot entries never leave. It returns how many left.
func (t *tracker) trim() int {
	over := len(t.entries) - t.max
	if over <= 0 {
		return 0
	}
	type cand struct {
		id    string
		score float64
	}
	cands := make([]cand, 0, len(t.entries))
	for id, e := range t.entries {
		if e.pinned || e.hot != nil {
			continue
		}
		cands = append(cands, cand{id, e.score + float64(e.lfu)})
	}
	if over > len(cands) {
		over = len(cands)
	}
	slices.SortFunc(cands, func(a, b cand) int {
		switch {
		case a.score < b.score:
			return -1
		case a.score > b.score:
			return 1
		}
		return 0
	})
	for _, c := range cands[:over] {
		delete(t.entries, c.id)
	}
	return over
}
