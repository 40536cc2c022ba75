package warmer

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// How the hot set is chosen: scan resistance, and refreshes that pay off.
//
// The access sorted set is a frequency estimate that ages: apps add 1 per read (ZINCRBY), and the daemon halves
// every score each decay_half_life. On its own it lets a scan pollute the hot set: every id read once enters with
// score 1, and while fewer than top_n ids have a better score, each one-hit id takes a hot slot and is refreshed,
// for nothing, until it decays away. Three rules, taken from the published answers to scan pollution, keep them
// out:
//
//   - Admission needs a second read (a doorkeeper). An id's entry counts the evidence of reads: its first
//     sighting, and every poll that found its score higher than the last one read (only reads raise a score; the
//     decay and the trim only lower it), two for a rise of 2 or more. An id becomes hot only after two. This is TinyLFU's
//     doorkeeper (Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache Admission Policy", ACM ToS
//     2017) and 2Q's probationary queue; ARC (Megiddo and Modha, FAST 2003) likewise keeps ids seen once (its T1)
//     apart from ids seen at least twice (T2).
//   - Refreshes that are not read demote. When a hot key is refreshed, the daemon judges the previous refresh: was
//     any read seen (a rising score) since then? A refresh followed by none is wasted. After wasteLimit wasted
//     refreshes in a row the id loses its admission (its read count restarts at zero) and leaves the hot set at
//     the next poll: it must be read twice again to come back. Keys that are read keep their slots; keys whose
//     refreshes keep being wasted give theirs to keys that are read. The counts also feed
//     keepwarm_warmer_refreshes_judged_total, keepwarm_warmer_refreshes_wasted_total and the gauge
//     keepwarm_warmer_wasted_refresh_ratio.
//   - top_n is a ceiling, not a target. The hot set is the admitted ids ranked by score, cut at top_n and at
//     min_score; when fewer ids are worth it, fewer are refreshed.
//
// An id's rank is its last score (plus its LFU counter), faded by decay_half_life for the time since a signal last
// named it. So when the access set is lost (FLUSHALL, eviction) and no new data arrives, the in-memory scores decay
// on their own and the refresh feedback demotes the keys nobody reads, instead of keeping a stale hot set warm
// for ever. During an origin outage the hot set is frozen (see loopState.poll): the fail-safe keeps
// every hot value alive, and no key near the cut-off drops out meanwhile.

// admitReads is how many polls must have seen evidence of a read before an id may become hot.
var admitReads = 2

// patience scales how long a hot id may go unread before it is demoted, in multiples of its expected gap between
// reads (see tracker.refreshed).
var patience = 2.0

// minWasted is the fewest refreshes in a row that must go unread before a hot id is demoted, whatever its rate.
var minWasted = 2

// entryFlags is the admission and refresh-feedback state of an entry.
type entryFlags uint8

const (
	flagAccess    entryFlags = 1 << iota // the access set named the id: the refresh feedback can judge its refreshes
	flagReadSince                        // a read was seen since the id's last refresh
	flagRefreshed                        // refreshed at least once since it became hot: the next refresh judges it
	readOne                              // polls that saw evidence of a read, in the two bits from here (0..3)
	readMask      = 3 * readOne
)

func (f entryFlags) reads() int { return int((f & readMask) / readOne) }

func (e *entry) setReads(n int) { e.flags = e.flags&^readMask | entryFlags(min(n, 3))*readOne }

// noteRead records evidence of n reads of the entry's id.
func (e *entry) noteRead(n int) {
	e.setReads(e.flags.reads() + n)
	e.wasted = 0
	e.flags |= flagReadSince
}

// observe records the access set's score of id, creating the entry if needed. A new entry, or a score higher than
// the last one seen, is evidence of a read; of two when it rose by 2 or more (apps add 1 per read, or 1/rate per
// sampled read: the score is an estimate of reads). So an id read twice between two polls, or found with a score
// of 2 or more when the daemon starts, is admitted at once, and one read once is not.
//
// With the frequency sketch on, a new entry starts with the reads the sketch remembers of its id (up to
// admitReads), so an id whose entry was trimmed between two reads is admitted at its next read as if the entry
// had stayed; and every rise is counted in the sketch, rounded, at least 1.
func (t *tracker) observe(id string, score float64, now int64) *entry {
	e, remembered := t.lookup(id)
	if t.lostScore(e, score, now) {
		// The access set lost this id's reads (emptied by a flush or a restart, evicted, failed over to a replica
		// that had not caught up): it is no evidence that the id cooled. The remembered score, decayed to now,
		// stands, and is written back to the access set (poll), so that every replica reads it again. Without
		// this, the ids apps read first after a Redis restart (the hottest) came back with scores of 1–3 and left
		// the hot set, while ids not read yet kept theirs: a 5-minute soak of Redis restarts saw hot keys go
		// unrefreshed for up to 4.9 s, missing and counted by no replica.
		e.score *= math.Exp2(-float64(now-e.seen) / t.halfLife.Seconds())
		e.seen = now
		e.flags |= flagAccess
		t.lost = append(t.lost, id)
		return e
	}
	if score > e.score {
		rise := score - e.score
		e.noteRead(min(max(int(rise), 1), admitReads))
		if t.sketch != nil {
			// A re-created entry starts at score 0, so its first rise is the id's whole access score, part of
			// which the sketch already counted before the entry was trimmed: only the reads beyond those go in.
			t.sketch.add(id, max(int(math.Round(rise))-int(remembered), 1))
			t.risen = append(t.risen, id)
		}
	}
	e.flags |= flagAccess
	e.score = score
	e.seen = now
	return e
}

// lostScore reports whether score, read for e at unix second now, fell further than decay explains: below half of
// e's score decayed over the time since it was read plus one decay interval of the access set (decay runs in
// steps of decayEvery). Only a score of at least lostScoreMin is judged: a loss that small does not move an id.
func (t *tracker) lostScore(e *entry, score float64, now int64) bool {
	// Decay only lowers the bound below e.score/2: a score at or above that (a rise, the usual reading) is no loss,
	// without the exponential that every observed id of every poll would otherwise cost.
	if score >= e.score/2 || t.halfLife <= 0 || e.score < lostScoreMin || e.seen == 0 || now < e.seen {
		return false
	}
	elapsed := float64(now-e.seen) + decayEvery(t.halfLife).Seconds()
	return score < e.score*math.Exp2(-elapsed/t.halfLife.Seconds())/2
}

// lostScoreMin is the least remembered score lostScore judges: below it, reads lost are too few to matter.
const lostScoreMin = 4

// takeLost returns the ids whose scores observe kept against a loss since the last call, with those scores.
func (t *tracker) takeLost() []redis.Z {
	if len(t.lost) == 0 {
		return nil
	}
	zs := make([]redis.Z, 0, len(t.lost))
	for _, id := range t.lost {
		if e := t.entries[id]; e != nil {
			zs = append(zs, redis.Z{Member: id, Score: e.score})
		}
	}
	t.lost = nil
	return zs
}

// lookup returns id's entry, creating it, with the reads the frequency sketch remembers, when there is none;
// remembered is that estimate for a new entry, 0 for an existing one.
func (t *tracker) lookup(id string) (e *entry, remembered uint8) {
	e = t.entries[id]
	if e == nil {
		e = &entry{}
		if t.sketch != nil {
			remembered = t.sketch.estimate(id)
			e.setReads(min(int(remembered), admitReads))
		}
		t.entries[id] = e
	}
	return e, remembered
}

// observeLFU records id's LFU counter above lfuInitVal, f > 0. It passes the same doorkeeper as the access set: a
// counter higher than the last one read is evidence of a read, of two when it rose by 2 or more. Redis counts
// only above lfuInitVal, so a key written and read once shows 1, which does not admit it (were any counter above
// lfuInitVal to admit, 1,000 keys read once would take every spare hot slot). Rises go into the frequency
// sketch as one read each: the counter is logarithmic, so a rise says "read again", not how often.
func (t *tracker) observeLFU(id string, f uint8, now int64) {
	e, _ := t.lookup(id)
	if f > e.lfu {
		e.noteRead(min(int(f-e.lfu), admitReads))
		if t.sketch != nil {
			t.sketch.add(id, 1)
		}
	}
	e.lfu = f
	e.seen = now
}

// rank is entry e of id's selection order at unix second now, best first by key, then by tie: without the
// frequency sketch, key is its last access score plus its LFU counter, halved for every decay_half_life since a
// signal last named it, and tie is 0; with it, key is the sketch's long-memory count in the access score's scale
// (frequencySketch.rate) and tie is that faded score. So ids are ranked by the reads of the last few
// history_half_lives, and ids whose counts are equal (the sketch's counters saturate at 255, so the hottest
// all are) by their recent reads. An id read once a minute keeps the rank its reads earn between them instead of
// decaying to nothing. Simulated on the ARC and key-value traces, the larger of the two
// gained nothing, their sum gained on the disk traces and lost 0.3 points on Zipf; this order gained 0.06 to 0.97
// points on every trace (docs/benchmarks.md §13).
//
// The refresh feedback estimates an id's expected gap between reads from key, its long-run rate: an id read in
// one burst is judged by the reads it had over the history, not by the burst. min_score applies to score, the
// larger of the two estimates, so that the sketch's saturation never hides a hot id under a high min_score.
func (t *tracker) rank(id string, e *entry, now int64) (key, tie, score float64) {
	r := e.score + float64(e.lfu)
	if age := now - e.seen; age > 0 && t.halfLife > 0 {
		r *= math.Exp2(-float64(age) / t.halfLife.Seconds())
	}
	if t.sketch == nil {
		return r, 0, r
	}
	long := t.sketch.rate(id, now, t.halfLife)
	return long, r, max(long, r)
}

// refreshed records a refresh of e published at unix second now, period after the one before, and judges that
// one: judged reports whether it could be (the id had a previous refresh in this hot spell, and the access set
// names it), wasted whether no read was seen since. An id that is not pinned is demoted (it loses its admission)
// once it has gone unread for more than patience times its expected gap between reads, estimated from its rank
// (a steady rate λ gives an access score of λ·halfLife/ln 2): a key read every 30 s survives the five or six
// unread refreshes between its reads, a key whose reads came in one burst leaves after a few, and at least
// minWasted unread refreshes are always allowed.
func (t *tracker) refreshed(id string, e *entry, now int64, period time.Duration) (judged, wasted bool) {
	prev := e.flags&flagRefreshed != 0
	read := e.flags&flagReadSince != 0
	e.flags = e.flags&^flagReadSince | flagRefreshed
	if !prev || e.flags&flagAccess == 0 {
		return false, false
	}
	if read {
		return true, false
	}
	if e.wasted < math.MaxUint8 {
		e.wasted++
	}
	if e.pinned || int(e.wasted) < minWasted {
		return true, true
	}
	unread := float64(e.wasted) * period.Seconds()
	r, _, score := t.rank(id, e, now)
	if r <= 0 {
		r = score // the sketch has no count for it (a new sketch after a reload, or a count halved to 0)
	}
	if r <= 0 || unread > patience*t.halfLife.Seconds()/(r*math.Ln2) {
		e.setReads(0)
		e.wasted = 0
	}
	return true, true
}

// leftHot resets the refresh feedback of an entry that is no longer hot: its next hot spell judges afresh.
func (e *entry) leftHot() {
	e.flags &^= flagRefreshed | flagReadSince
	e.wasted = 0
}

// selectHot returns the ids that should be hot at unix second now: every pinned id, plus at most topN admitted
// candidates (see admitReads) ranked by entry.rank, each ranking at least minScore and above 0. Candidates are the
// ids the latest signals named and the currently hot ids, so the work is proportional to the hot set, not to the
// tracked set.
func (t *tracker) selectHot(candidates []string, topN int, minScore float64, now int64) map[string]bool {
	hot := make(map[string]bool, topN+len(t.pinned))
	for id := range t.pinned {
		hot[id] = true
	}
	type cand struct {
		id       string
		key, tie float64
	}
	// Candidates repeat (an id can be in the access set's top, the LFU sample and the hot set at once); marking
	// the entries with this call's generation skips repeats without building a map of every candidate per poll.
	t.gen++
	cs := make([]cand, 0, len(candidates)+len(t.risen))
	risen := t.risen
	// Not kept for the next poll: a full sync can name every tracked id, and a slice that size would stay
	// allocated for good (16 B per tracked id at 1M ids).
	t.risen = nil
	for _, ids := range [][]string{candidates, risen} {
		for _, id := range ids {
			e := t.entries[id]
			if e == nil || e.mark == t.gen || e.pinned {
				continue
			}
			e.mark = t.gen
			if e.flags.reads() < admitReads {
				continue
			}
			if key, tie, score := t.rank(id, e, now); score >= minScore && score > 0 {
				cs = append(cs, cand{id, key, tie})
			}
		}
	}
	slices.SortFunc(cs, func(a, b cand) int {
		if c := cmp.Compare(b.key, a.key); c != 0 {
			return c
		}
		return cmp.Compare(b.tie, a.tie)
	})
	for i := 0; i < len(cs) && i < topN; i++ {
		hot[cs[i].id] = true
	}
	return hot
}

// wasteRatio is a keyspace's share of judged refreshes that were wasted, over a window that fades with the
// keyspace's decay_half_life: the number an operator tunes top_n and min_score with.
type wasteRatio struct {
	judged, wasted           float64 // faded sums
	at                       time.Time
	ratio                    float64 // the last add's result
	totalJudged, totalWasted int64   // since start
}

// add folds in judged refreshes, wasted of them, at now, and returns the ratio (0 before any was judged).
func (w *wasteRatio) add(now time.Time, judged, wasted int, halfLife time.Duration) float64 {
	if !w.at.IsZero() && halfLife > 0 {
		f := math.Exp2(-now.Sub(w.at).Seconds() / halfLife.Seconds())
		w.judged *= f
		w.wasted *= f
	}
	w.at = now
	w.judged += float64(judged)
	w.wasted += float64(wasted)
	w.totalJudged += int64(judged)
	w.totalWasted += int64(wasted)
	w.ratio = 0
	if w.judged > 0 {
		w.ratio = w.wasted / w.judged
	}
	return w.ratio
}

// judge runs the refresh feedback for a refresh of h published at now (see tracker.refreshed), before
// h.lastRefresh moves to now, and updates the keyspace's waste metrics.
func (k *loopState) judge(h *hotState, now time.Time) {
	judged, wasted := k.tr.refreshed(h.id, h.e, now.Unix(), now.Sub(h.lastRefresh))
	if !judged {
		return
	}
	k.w.m.judged.WithLabelValues(k.name).Inc()
	n := 0
	if wasted {
		k.w.m.wasted.WithLabelValues(k.name).Inc()
		n = 1
	}
	k.w.m.wasteRatio.WithLabelValues(k.name).Set(k.waste.add(now, 1, n, k.cfg.DecayHalfLife))
}

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

// hotState is the refresh state of a hot key, owned by the loop (it is reached only through the loopState).
type hotState struct {
	id     string
	serial uint64 // this hot spell's number in its keyspace (loopState.hotSerial): a batchKey names it
	e      *entry
	idx    int       // position in the due queue, -1 when not queued
	due    time.Time // when the next refresh is due

	expiry    time.Time // best known expiry of the cache key; zero when unknown or missing
	learnedAt time.Time // when the value of that expiry was written by the daemon, or first seen
	needPTTL  bool      // the expiry must be (re)learnt with PTTL before the key is scheduled
	goneEvent string    // with needPTTL: the expired, evicted or del event that asked for the PTTL (see onEvent)
	// expiredHeard is when Redis last announced this key expired while it was hot and owned here (event; zero: not
	// since the last reading). Heard at or after the known expiry, it proves the value the daemon knew expired
	// unrewritten: a new value read after it is a rebuild after a miss, however close to that expiry (learnExpiries).
	expiredHeard time.Time
	// doubted is the expiry of the value last replaced, uncounted, by a new value read within expiryTolerance of
	// it (judgeRebuild; zero: none since): an expired keyevent heard soon after, while the new value is far from
	// its own expiry, can only be that value's, and counts its miss then (doubtResolved).
	doubted     time.Time
	persistent  bool          // PTTL −1: the key has no TTL; it is reported and never overwritten
	inflight    bool          // a refresh batch holds this key
	missing     bool          // the origin had no row at the last refresh
	lastRebuild time.Duration // duration of the last successful rebuild (origin query)
	rebuildP95  time.Duration // decayed-maximum estimate of the rebuild p95
	lastRefresh time.Time
	// refreshFoundValue: the last refresh's publish replaced a value that was there (its TTL known and > 0), so
	// the key was present just before it (readPTTLs, after a flush).
	refreshFoundValue bool
	lastErr           string
	errors            int    // consecutive failed refreshes, for back-off
	counted           bool   // this expiry was already counted as an SLO miss (re-armed by each new value learnt)
	shortNotice       bool   // the expiry was learnt less than one lead before it (a breakdown of misses, not an exemption)
	invalidated       bool   // the current absence is an invalidation (a del event, or lock_gone): not an SLO miss
	pendingGone       string // a gone event (expired, evicted, del, or a flush) that arrived while a refresh was in flight
	// flushCounted: a flush emptied Redis while this key's refresh was in flight, and its loss was counted at once
	// (rereadOwned); the re-read after the refresh settles judges the same gap, so it counts nothing.
	flushCounted bool
	// lockGoneAt is when a refresh last found its lock gone and took it for an invalidation (settleOne), and
	// lockGoneExpiry and lockGoneLearned the expiry and learnedAt of the value known then: a flush noticed later
	// whose emptying began before lockGoneAt took that lock, not an app, and counts that value's loss
	// (rereadOwned).
	lockGoneAt, lockGoneExpiry, lockGoneLearned time.Time
	handover                                    bool      // adopted from another fleet replica; its first PTTL reading may be an SLO miss
	hotSince                                    time.Time // when the id became hot
	// ownedSince is when this replica last came to own the id while it was hot: when it turned hot already owned,
	// when a new member list gave it to this replica, or when this replica's own lapsed heartbeat was renewed (the
	// others owned it meanwhile). Zero while another replica owns it. KeyStatus.OwnedSince.
	ownedSince time.Time
	// takenOverAt is when this replica last gained the key from another (applyView), and goneHeard when Redis last
	// announced it expired, evicted or deleted while another replica owned it (zero once a write of it is heard):
	// a key taken over gone since before its previous owner's last heartbeat was no miss of its (noteHandover).
	takenOverAt, goneHeard time.Time
	goneHeardKind          string // goneHeard's event: expired, evicted or del
	// flushedSince is, while a flush's re-read of the key is pending (rereadAll), the moment since which Redis is
	// known emptied (the flush canary's last write); zero otherwise.
	flushedSince time.Time
	missedAt     time.Time // when this key's last SLO miss was counted (countMiss)
	missedExpiry time.Time // the expiry of the value whose loss that miss was (zero: unknown)
	missSeen     time.Time // that miss's date in its fleet claim (miss.seen), for the next miss's claim (miss.after)

	// Reconciliation (reconcile.go).
	cidx        int       // position in the check queue, -1 when not queued
	checkAt     time.Time // when its PTTL is next re-checked
	ownWrite    bool      // the current value is the daemon's own write, so its expiry is known
	notifyEpoch uint64    // trustState.epoch when ownWrite was last confirmed: trusted while it is current
	ownSetUntil time.Time // until then, the first "set" notification is the own write's (see ownSetWindow)
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

// tracker holds one keyspace's tracked ids. It is not safe for concurrent use: the loop owns it (loopState.tr).
type tracker struct {
	entries  map[string]*entry
	pinned   map[string]bool
	max      int
	gen      uint32        // bumped by each selectHot, to skip duplicate candidates without a set of its own
	halfLife time.Duration // decay_half_life: how fast an id's score fades once no signal names it any more
	// sketch is the long memory of reads (sketch.go), sized for max; nil turns it off (the selection without
	// the long memory, kept for the simulation's comparison).
	sketch *frequencySketch
	// risen are the ids whose access score rose (a read) since the last selectHot, wherever the signal came from
	// (the top of the access set, or the full sync's whole tracked window): with the sketch, an id read below the
	// top can still rank among the best, so each is a candidate once after its read.
	risen []string
	// lost are the ids whose access score fell further than decay explains since the last takeLost (observe): a
	// lost access set, whose scores poll writes back.
	lost []string
	// pinnedGen is bumped by every setPinned: a pinned-only keyspace's hot set is the pinned set, recomputed only
	// when this changes (poll).
	pinnedGen uint64
}

// newTracker returns a tracker of at most maxTracked ids whose scores fade with halfLife (decay_half_life), and
// whose frequency sketch ages with historyHalfLife (history_half_life; 0: no sketch), started at unix second now.
func newTracker(maxTracked int, halfLife, historyHalfLife time.Duration, now int64) *tracker {
	t := &tracker{entries: make(map[string]*entry), pinned: make(map[string]bool), max: maxTracked, halfLife: halfLife}
	t.resize(maxTracked, historyHalfLife, now)
	return t
}

// age ages the frequency sketch, if any, to unix second now (see frequencySketch.age); each poll calls it before
// its signals go in.
func (t *tracker) age(now int64) {
	if t.sketch != nil {
		t.sketch.age(now)
	}
	// A poll that did not select (the hot set is frozen during an origin outage) leaves its risen ids behind:
	// dropped here, so that they cannot pile up for the length of the outage.
	t.risen = nil
}

// resize applies max_tracked and history_half_life (from a reload). The sketch keeps its counts unless its
// width must change with max_tracked; then its history starts again.
func (t *tracker) resize(maxTracked int, historyHalfLife time.Duration, now int64) {
	t.max = maxTracked
	switch {
	case historyHalfLife <= 0:
		t.sketch = nil
	case t.sketch == nil || t.sketch.mask+1 != sketchWidth(maxTracked):
		t.sketch = newFrequencySketch(maxTracked, historyHalfLife, now)
	default:
		t.sketch.halfLife = historyHalfLife
	}
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
	t.pinnedGen++
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

// batchKey is what a refresh batch knows of a hot key: an immutable copy of its id and hot spell (serial), handed
// to the batch's goroutine instead of the loop's *hotState. The loop's messages find the state again with hotOf.
type batchKey struct {
	id     string
	serial uint64
}

// batchKeys returns the batchKeys of hs, for a batch's goroutine.
func (k *loopState) batchKeys(hs []*hotState) []batchKey {
	out := make([]batchKey, len(hs))
	for i, h := range hs {
		out[i] = batchKey{id: h.id, serial: h.serial}
	}
	return out
}

// hotOf returns the hot state that b names, or nil when that hot spell ended (the id left the hot set since the
// batch was formed, and maybe came back as a new spell) or b names none (a warmup's or a change's item).
func (k *loopState) hotOf(b batchKey) *hotState {
	if h := k.hotSet[b.id]; h != nil && b.serial != 0 && h.serial == b.serial {
		return h
	}
	return nil
}
