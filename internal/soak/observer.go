package soak

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// observer is the independent miss observer: it polls every hot key with one pipelined PTTL
// per key every interval, through its own Redis client, and records every gap (the key absent while hot) with
// its start, its length and its keyspace. It trusts nothing the daemon says about misses; the only thing it takes
// from the daemons is which keys are hot (the union of the replicas' /debug/hotkeys, re-read every second by the
// caller and published through hot).
type observer struct {
	rdb       redis.UniversalClient
	interval  time.Duration                       // between polls; 50 ms in the soak
	hot       func() map[string]string            // cache key → keyspace: the current hot union (nil: none yet)
	blind     atomic.Int64                        // polls that failed (Redis paused, restarting, unreachable)
	blindTime atomic.Int64                        // ns spent in polls that took more than two intervals
	polls     atomic.Int64                        // polls that succeeded
	track     *gapTracker                         // owned by run
	onPoll    func(at time.Time, absent, hot int) // optional, for progress; called from run
	// unread holds the spans longer than maxUnread between the starts of consecutive polls that read, and from
	// the last of them to the end: what the observer did not see. Written by run, read once it has returned.
	unread []span
	// emptied carries the moments the nemesis emptied the whole data set (FLUSHDB): every hot key read present
	// at its last poll was gone at that instant, even if it is back before the next poll (a rebuild within one
	// interval would otherwise hide the gap). Optional; buffered by the sender.
	emptied chan flush
}

// maxUnread is the longest the observer may go without a reading outside the faults that make Redis unreadable
// (soakReport's cadence check): keys that expire and are rebuilt unseen within such a span show as blinks at best,
// whose lengths are upper bounds and which the per-key check cannot judge.
const maxUnread = time.Second

// span is an interval of time.
type span struct{ from, to time.Time }

// flush is one FLUSHDB of the nemesis: sent before the command went out, done when its reply came. Redis emptied
// the data set somewhere between; a reading taken between the two may come from before or after it.
type flush struct{ sent, done time.Time }

// run polls until ctx ends and returns the gaps it saw, those still open closed at the end of the run.
func (o *observer) run(ctx context.Context) []gap {
	t := time.NewTicker(o.interval)
	defer t.Stop()
	var lastRead time.Time // the start of the last poll that read
	unread := func(now time.Time) {
		if !lastRead.IsZero() && now.Sub(lastRead) > maxUnread {
			o.unread = append(o.unread, span{lastRead, now})
		}
	}
	for {
		select {
		case <-ctx.Done():
			now := time.Now()
			unread(now)
			return o.track.finish(now)
		case fl := <-o.emptied:
			o.track.emptied(fl.sent, fl.done)
			continue
		case <-t.C:
		}
		select { // a flush reported meanwhile is applied before the next poll (select picks among ready cases at random)
		case fl := <-o.emptied:
			o.track.emptied(fl.sent, fl.done)
		default:
		}
		hot := o.hot()
		if hot == nil {
			continue
		}
		keys := make([]string, 0, len(hot))
		for k := range hot {
			keys = append(keys, k)
		}
		// go-redis bounds a poll by its read timeout (3 s by default), not by this context, unless the client has
		// ContextTimeoutEnabled: a paused Redis stalls the observer for that long, which blindTime reports. The gaps
		// start right (at the key's predicted expiry, whichever poll finds it gone); an end can be late by the stall.
		pctx, cancel := context.WithTimeout(ctx, o.interval*4)
		at := time.Now()
		cmds, _ := o.rdb.Pipelined(pctx, func(p redis.Pipeliner) error {
			for _, k := range keys {
				p.PTTL(pctx, k)
			}
			return nil
		})
		cancel()
		if took := time.Since(at); took > 2*o.interval {
			o.blindTime.Add(int64(took))
		}
		// A Cluster pipeline fails as a whole when one node does; the readings from the others still count.
		pttl := make(map[string]time.Duration, len(keys))
		for i, c := range cmds {
			d, err := c.(*redis.DurationCmd).Result()
			if err != nil {
				continue
			}
			pttl[keys[i]] = d
		}
		if len(pttl) == 0 && len(keys) > 0 {
			o.blind.Add(1)
			continue
		}
		o.polls.Add(1)
		unread(at)
		lastRead = at
		absent := o.track.observe(at, hot, pttl)
		if o.onPoll != nil {
			o.onPoll(at, absent, len(hot))
		}
	}
}

// gap is one interval in which a hot key was absent from Redis, as the observer saw it.
type gap struct {
	Keyspace string
	Key      string
	Start    time.Time
	// Length is the time from Start to the first poll that found the key back (or no longer hot). Its error is
	// one poll interval either way.
	Length time.Duration
	// Blink marks a key whose predicted expiry passed between two polls that both found it present with a new
	// TTL: it expired and was rewritten within one interval, or it was refreshed in the last moment before its
	// expiry; the observer cannot tell which. Length is then an upper bound.
	Blink bool
	// ColdStart marks a key that was absent when it entered the hot set and has not been seen present since: not
	// an expiry of a value the daemon kept, but a hot key it had not written yet.
	// Also, at the end of the run (judgeOwnership), a gap that began within firstReadGrace of its key turning hot
	// on its owner: the owner had not read its TTL yet.
	ColdStart bool
	// Open marks a gap that was still open when the observer stopped.
	Open bool
	// Unowned marks a gap on a key that no replica had hot and owned at the gap's start, by the ownership history
	// judged at the end of the run (judgeOwnership): hot for a replica that does not refresh it, not for its owner
	// (the replicas' hot sets differ at the top_n edge), or hot for its owner only since it was already missing (a
	// key at the edge that left its owner's hot set, expired, and came back). Not a hot key by the SLO's definition
	// (docs/operations.md, "The SLO, precisely").
	Unowned bool
	// Owner is the replica whose /debug/hotkeys vouched that it held the key hot and owned it (empty when
	// Unowned): the daemon whose log should name the gap.
	Owner string
	// Vouch is the owner's span that vouched, as the report prints it (offsets from the run's start): why the gap
	// is judged the owner's.
	Vouch ownedSpan
	// Vanished marks a key found gone before the expiry its last PTTL predicted: deleted (an invalidation), flushed
	// or evicted, not expired.
	Vanished bool
}

// keyState is what the observer knows of one hot key.
type keyState struct {
	ks       string
	expiry   time.Time // predicted from the last PTTL reading; zero when absent or without a TTL
	lastPoll time.Time // the last poll that read the key
	// prevPoll and prevPresent are the reading before lastPoll: a flush reported only after the next poll had
	// read the key (that poll was in flight when the flush ran) is judged by the reading before it (emptied).
	prevPoll    time.Time
	prevPresent bool
	seen        bool // read present since it entered the hot set
	// recent are the key's last readings, oldest first (at most recentReadings): a report that the data set was
	// emptied (emptied) can come a few polls late, after a restart of Redis, and is judged by the reading
	// before it.
	recent []pttlReading
	gap    *gap // the open gap, if absent
}

// pttlReading is one poll's finding for one key.
type pttlReading struct {
	at         time.Time
	present    bool
	persistent bool // present without a TTL
}

// recentReadings is how many readings a key keeps (keyState.recent): at the 50 ms interval, 400 ms, twice the
// longest Redis restart the soak has seen (down 275 ms) plus the report's delay.
const recentReadings = 8

// gapTracker turns the observer's polls into gaps. It has no clock and no Redis, so that tests can drive it.
type gapTracker struct {
	// tolerance is how far past a key's predicted expiry a poll must be before a rewritten key counts as a
	// blink: the PTTL reading's own error (the round trip) is absorbed by it.
	tolerance time.Duration
	maxGaps   int // the soak's memory bound: gaps beyond it are counted in dropped only
	keys      map[string]*keyState
	gaps      []gap
	dropped   int
	// watched holds, per key, the spans in which the key was in the hot union and so polled (to zero: still
	// is): outside them the tracker could not have seen a gap of the key. The union lags the replicas' hot sets
	// by up to a second or two (its refresh, their answers), so a key that turns hot and expires within that lag
	// is counted by its owner and never watched.
	watched map[string][]span
}

func newGapTracker(tolerance time.Duration, maxGaps int) *gapTracker {
	return &gapTracker{tolerance: tolerance, maxGaps: maxGaps, keys: map[string]*keyState{}, watched: map[string][]span{}}
}

// observe records one poll taken at at: hot maps each hot key to its keyspace, pttl holds the PTTL readings
// (-2 ns absent, as go-redis reports a missing key; -1 ns no TTL) of the hot keys that were read. A hot key with
// no reading is left as it was. It returns how many hot keys were absent.
func (g *gapTracker) observe(at time.Time, hot map[string]string, pttl map[string]time.Duration) int {
	for k, st := range g.keys {
		if _, ok := hot[k]; !ok {
			if st.gap != nil {
				g.close(st, at)
			}
			delete(g.keys, k) // not hot any more: its next absence is not a miss
			if w := g.watched[k]; len(w) > 0 && w[len(w)-1].to.IsZero() {
				w[len(w)-1].to = at
			}
		}
	}
	absent := 0
	for k, ks := range hot {
		p, ok := pttl[k]
		if !ok {
			continue
		}
		st := g.keys[k]
		if st == nil {
			st = &keyState{ks: ks}
			g.keys[k] = st
			g.watched[k] = append(g.watched[k], span{from: at})
		}
		wasPresent := !st.lastPoll.IsZero() && st.gap == nil // the reading at lastPoll found it present
		if p == -2 {
			absent++
			if st.gap == nil {
				start := at
				// It expired at its predicted expiry if that fell after the previous reading.
				if !st.expiry.IsZero() && st.expiry.Before(at) && st.expiry.After(st.lastPoll) {
					start = st.expiry
				}
				vanished := st.seen && !st.expiry.IsZero() && !st.expiry.Before(at)
				st.gap = &gap{Keyspace: ks, Key: k, Start: start, ColdStart: !st.seen, Vanished: vanished}
			}
			st.expiry = time.Time{}
		} else {
			if st.gap != nil {
				g.close(st, at)
			} else if st.seen && !st.expiry.IsZero() && at.Sub(st.expiry) > g.tolerance {
				var next time.Time
				if p >= 0 {
					next = at.Add(p)
				}
				if next.IsZero() || next.After(st.expiry) {
					g.add(gap{Keyspace: ks, Key: k, Start: st.expiry, Length: at.Sub(st.expiry), Blink: true})
				}
			}
			st.seen = true
			st.expiry = time.Time{}
			if p >= 0 {
				st.expiry = at.Add(p)
			}
		}
		st.prevPoll, st.prevPresent, st.lastPoll = st.lastPoll, wasPresent, at
		if len(st.recent) == recentReadings {
			st.recent = append(st.recent[:0], st.recent[1:]...)
		}
		st.recent = append(st.recent, pttlReading{at: at, present: p != -2, persistent: p == -1})
	}
	return absent
}

// emptied records that the whole data set was emptied between at (FLUSHDB sent, or Redis stopped for a restart)
// and done (the reply, or Redis back): every key read present, with a TTL, at its last reading before at had
// exactly one gap from at, which the tracker records from the readings since at (the report can come a few polls
// late: a restart takes 150–300 ms, and the polls go on as soon as Redis is back):
//   - none: the gap is opened at at, and the next poll that reads the key present closes it (an upper bound,
//     within one interval, when the key was rebuilt at once);
//   - one absent: the tracker opened (or opened and closed) a gap then; it starts at at;
//   - all present, one at or after done: the key was rebuilt before it, a closed gap from at to that reading;
//   - all present before done: they may predate the flush, so the gap is opened at at as in the first case.
//
// Without the late cases a machine fast enough to rebuild keys within one poll hid them: a CI run counted 698
// flushed keys for 669 gaps seen, and a 3-minute soak of Redis restarts (seed 6002) saw 80 gaps of the 25 genre
// charts' 100 flushes, and failed the phantom check.
func (g *gapTracker) emptied(at, done time.Time) {
	for k, st := range g.keys {
		i := len(st.recent) // the readings since at are st.recent[i:]
		for i > 0 && !st.recent[i-1].at.Before(at) {
			i--
		}
		if i == 0 || !st.recent[i-1].present || st.recent[i-1].persistent {
			continue // no reading before the flush (hot since, or read too long ago), or absent then, or no TTL
		}
		since := st.recent[i:]
		switch {
		case st.gap != nil:
			st.gap.Start = minTime(st.gap.Start, at)
		case slices.ContainsFunc(since, func(r pttlReading) bool { return !r.present }):
			// Read absent and then present again since: the gap the tracker closed started at the flush.
			for j := len(g.gaps) - 1; j >= 0; j-- {
				if x := &g.gaps[j]; x.Key == k && !x.Start.Before(at) {
					x.Length += x.Start.Sub(at)
					x.Start = at
					break
				}
			}
		default:
			if j := slices.IndexFunc(since, func(r pttlReading) bool { return !r.at.Before(done) }); j >= 0 {
				g.add(gap{Keyspace: st.ks, Key: k, Start: at, Length: since[j].at.Sub(at)})
				continue
			}
			st.gap = &gap{Keyspace: st.ks, Key: k, Start: at}
			st.expiry = time.Time{}
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func (g *gapTracker) close(st *keyState, at time.Time) {
	st.gap.Length = at.Sub(st.gap.Start)
	g.add(*st.gap)
	st.gap = nil
}

func (g *gapTracker) add(x gap) {
	if len(g.gaps) >= g.maxGaps {
		g.dropped++
		return
	}
	g.gaps = append(g.gaps, x)
}

// watchedAt reports whether key was in the hot union, and polled, at t (spans still open run on).
func watchedAt(watched map[string][]span, key string, t time.Time) bool {
	for _, w := range watched[key] {
		if !t.Before(w.from) && (w.to.IsZero() || !t.After(w.to)) {
			return true
		}
	}
	return false
}

// finish closes the gaps still open at at, marked Open, and returns every gap.
func (g *gapTracker) finish(at time.Time) []gap {
	for _, st := range g.keys {
		if st.gap != nil {
			st.gap.Open = true
			g.close(st, at)
		}
	}
	return g.gaps
}
