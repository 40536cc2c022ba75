package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/benchload"
	"github.com/keepwarm/keepwarm/lockstep"
)

// The freshness observer judges the change-driven refresh from outside, as an app sees it: for each row update
// the soak's updater commits, it reads the cached keys the update affects (track:<id>, its album's key, the old
// album's key after a move, its genre's chart when the chart lists the track) until each shows the new row or is
// gone, and dates that against the moment the commit returned. It takes nothing from the daemons: no /debug, no
// metrics. The daemons' freshness counters are compared with its verdicts in the report.
//
// What "shows the new row" means: a row of track X goes through states in commit order (the updater serialises
// the updates of one track, so that the order in which commits return is the commit order). A value reflects
// change C of X when the state it shows of X is C's or a later one: the track key's name; the album key's entry
// for X (its name), or, when it does not list X, a state at or after C that has X in another album; the chart's
// entry for X (a chart that does not list X is unaffected by a name: the ranking does not depend on it). A key
// that is absent (expired, invalidated, flushed) is not stale: the next read rebuilds it from the committed row.

// Roles of a judged key for its change.
const (
	roleTrack    = "track"     // track:<id>
	roleAlbum    = "album"     // the album the track is in after the change
	roleOldAlbum = "old album" // the album a move took the track out of
	roleChart    = "chart"     // chart:genre:<the track's genre>, when it listed the track before the commit
)

// Verdicts of a judged key (and of a change: its worst key's).
const (
	verdictWithin     = "within"     // fresh (or gone) at a reading answered within the bound after the commit
	verdictLate       = "late"       // still stale at a reading sent more than the bound after the commit
	verdictBorderline = "borderline" // neither: resolved between two readings that straddle the bound
	verdictNever      = "never"      // still stale at the last reading, when the observer stopped
)

// freshTarget is one cached key a change affects, and what the observer read of it.
type freshTarget struct {
	Key, Keyspace, Role string
	Album               string // the album id, for the album roles
	// LastStale is when the last reading that found the key stale was sent (zero: none since the commit).
	LastStale time.Time
	// Resolved is set once a reading found the key fresh or absent; Lo and Hi bound the moment it became so:
	// after the send of the last stale reading (or the commit) and before the reply of the resolving one.
	Resolved bool
	Lo, Hi   time.Time
	Absent   bool  // resolved by the key's absence, not by the new row
	Poll     int64 // the resolving poll's number: keys resolved at one poll are one publish at most
}

// verdict is the target's verdict for a change committed at committed, with the freshness bound.
func (t *freshTarget) verdict(committed time.Time, bound time.Duration) string {
	switch {
	case !t.Resolved:
		return verdictNever
	case t.Hi.Sub(committed) <= bound:
		return verdictWithin
	case t.Lo.Sub(committed) > bound:
		return verdictLate
	}
	return verdictBorderline
}

// freshChange is one committed row update and the keys it is judged on (none: nothing was cached).
type freshChange struct {
	Seq       int64
	Track     string
	Name      string
	Started   time.Time // when the UPDATE was sent
	Committed time.Time // when the commit returned: visible to a new snapshot by then
	Move      bool
	state     int // its index in the track's history
	Targets   []*freshTarget
}

// verdict is the change's worst key's verdict ("" when no key was judged).
func (c *freshChange) verdict(bound time.Duration) string {
	rank := map[string]int{verdictWithin: 1, verdictBorderline: 2, verdictLate: 3, verdictNever: 4}
	out := ""
	for _, t := range c.Targets {
		if v := t.verdict(c.Committed, bound); rank[v] > rank[out] {
			out = v
		}
	}
	return out
}

// trackState is one state of a track row: its name and album after an update, which may have failed (ok false:
// it may or may not have committed, so that a value showing its name is still understood).
type trackState struct {
	name, album string
	ok          bool
}

// trackHistory is every state of one track row the updater wrote, in commit order.
type trackHistory struct{ states []trackState }

// index returns the index of the last state named name, or -1 (the row's name from before the soak).
func (h *trackHistory) index(name string) int {
	for i := len(h.states) - 1; i >= 0; i-- {
		if h.states[i].name == name {
			return i
		}
	}
	return -1
}

// freshTracker is the observer's bookkeeping, without Redis or a clock, so that tests can drive it: the updater
// registers each update and its cached keys (register), the poller asks for the keys to read (pendingKeys) and
// hands back the readings (observe).
type freshTracker struct {
	bound      time.Duration
	maxPending int // targets awaiting a verdict at most; changes beyond it are not judged (skipped)

	mu      sync.Mutex // guards everything below: written by the updater's workers and the poller
	tracks  map[string]*trackHistory
	changes []*freshChange
	pending map[string][]*pendingTarget // cache key → targets not resolved yet
	npend   int
	skipped int   // committed changes not judged because pending was at its bound
	polls   int64 // readings handed to observe
}

type pendingTarget struct {
	c *freshChange
	t *freshTarget
}

func newFreshTracker(bound time.Duration, maxPending int) *freshTracker {
	return &freshTracker{bound: bound, maxPending: maxPending, tracks: map[string]*trackHistory{},
		pending: map[string][]*pendingTarget{}}
}

// cachedKey is a key of an update's affected set as read just before the commit.
type cachedKey struct {
	key, keyspace, role, album string
	value                      []byte // nil: absent, not judged
}

// register records an update of track to name and album (its album after the update), committed at committed
// (err nil) or failed (err set: it may have committed all the same). cached are the affected keys as read before
// the commit; those present are judged. Updates of one track must be registered in commit order.
func (ft *freshTracker) register(seq int64, track, name, album string, move bool, started, committed time.Time, err error, cached []cachedKey) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	h := ft.tracks[track]
	if h == nil {
		h = &trackHistory{}
		ft.tracks[track] = h
	}
	h.states = append(h.states, trackState{name: name, album: album, ok: err == nil})
	if err != nil {
		return
	}
	c := &freshChange{Seq: seq, Track: track, Name: name, Started: started, Committed: committed, Move: move, state: len(h.states) - 1}
	ft.changes = append(ft.changes, c)
	for _, k := range cached {
		if k.value == nil {
			continue
		}
		if k.role == roleChart {
			if _, listed, ok := listedTrack(k.value, "top", "track_id", track); !ok || !listed {
				continue // a chart without the track does not change with its name
			}
		}
		if ft.npend >= ft.maxPending {
			ft.skipped++
			c.Targets = nil
			return
		}
		c.Targets = append(c.Targets, &freshTarget{Key: k.key, Keyspace: k.keyspace, Role: k.role, Album: k.album})
	}
	for _, t := range c.Targets {
		ft.pending[t.Key] = append(ft.pending[t.Key], &pendingTarget{c, t})
		ft.npend++
	}
}

// pendingKeys returns the keys with targets awaiting a verdict.
func (ft *freshTracker) pendingKeys() []string {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	out := make([]string, 0, len(ft.pending))
	for k := range ft.pending {
		out = append(out, k)
	}
	return out
}

// reading is one GET of a poll: the value, or absent.
type reading struct {
	value   []byte
	present bool
}

// observe judges the pending targets of the keys read by one poll, sent at sent and answered at reply; keys
// missing from values were not read (an error) and stay as they were. A reading sent before a change's commit
// returned cannot judge it.
func (ft *freshTracker) observe(sent, reply time.Time, values map[string]reading) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	ft.polls++
	for key, r := range values {
		ps := ft.pending[key]
		if len(ps) == 0 {
			continue
		}
		left := ps[:0]
		for _, p := range ps {
			if !sent.After(p.c.Committed) {
				left = append(left, p)
				continue
			}
			if r.present && !ft.fresh(p.c, p.t, r.value) {
				p.t.LastStale = sent
				left = append(left, p)
				continue
			}
			p.t.Resolved, p.t.Absent, p.t.Poll = true, !r.present, ft.polls
			p.t.Lo, p.t.Hi = p.c.Committed, reply
			if p.t.LastStale.After(p.t.Lo) {
				p.t.Lo = p.t.LastStale
			}
			ft.npend--
		}
		if len(left) == 0 {
			delete(ft.pending, key)
		} else {
			ft.pending[key] = left
		}
	}
}

// fresh reports whether value, read from target t's key, reflects change c or a later state of its track.
func (ft *freshTracker) fresh(c *freshChange, t *freshTarget, value []byte) bool {
	h := ft.tracks[c.Track]
	switch t.Role {
	case roleTrack:
		var v struct {
			Name *string `json:"name"`
		}
		if json.Unmarshal(value, &v) != nil || v.Name == nil {
			return false
		}
		return h.index(*v.Name) >= c.state
	case roleAlbum, roleOldAlbum:
		name, listed, ok := listedTrack(value, "tracks", "id", c.Track)
		if !ok {
			return false
		}
		if listed {
			return h.index(name) >= c.state
		}
		for _, s := range h.states[c.state:] {
			if s.album != t.Album {
				return true
			}
		}
		return false
	case roleChart:
		name, listed, ok := listedTrack(value, "top", "track_id", c.Track)
		return ok && (!listed || h.index(name) >= c.state)
	}
	return false
}

// listedTrack finds track id in the list field of a JSON object value (album "tracks" with "id", chart "top"
// with "track_id") and returns its name. ok is false when value is not such an object.
func listedTrack(value []byte, list, idField, id string) (name string, listed, ok bool) {
	var v map[string]json.RawMessage
	if json.Unmarshal(value, &v) != nil {
		return "", false, false
	}
	raw, found := v[list]
	if !found {
		return "", false, false
	}
	var entries []map[string]json.RawMessage
	if json.Unmarshal(raw, &entries) != nil {
		return "", false, false
	}
	for _, e := range entries {
		if string(e[idField]) != id {
			continue
		}
		var n string
		if json.Unmarshal(e["name"], &n) != nil {
			return "", false, false
		}
		return n, true, true
	}
	return "", false, true
}

// movesBetween counts the committed moves whose commit returned in [from, to].
func (ft *freshTracker) movesBetween(from, to time.Time) int {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	n := 0
	for _, c := range ft.changes {
		if c.Move && !c.Committed.Before(from) && !c.Committed.After(to) {
			n++
		}
	}
	return n
}

// updatesWithin counts the committed updates sent at or after from whose commit returned at or before to.
func (ft *freshTracker) updatesWithin(from, to time.Time) int {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	n := 0
	for _, c := range ft.changes {
		if !c.Started.Before(from) && !c.Committed.After(to) {
			n++
		}
	}
	return n
}

// finish ends the observation: targets still pending are never resolved. It returns every committed change in
// registration order and how many were not judged for the bound.
func (ft *freshTracker) finish() ([]*freshChange, int) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	ft.pending = map[string][]*pendingTarget{}
	ft.npend = 0
	return slices.Clone(ft.changes), ft.skipped
}

// freshObserver is the freshness observer's Redis side: the updater's hook (benchload.UpdateHook) and the poller.
type freshObserver struct {
	track    *freshTracker
	rdb      redis.UniversalClient // the observer's own client, as an app's
	pool     *pgxpool.Pool         // reads a track's album and genre before its update
	keys     map[string]*lockstep.Keys
	interval time.Duration // between polls at least
	budget   int           // keys read per second at most: the interval grows with the pending keys
	// trackLocks serialise the updates of one track (striped by id), so that their commits return in commit order.
	trackLocks [64]sync.Mutex
	move       atomic.Bool // the next update moves its track (a fault asked for a move)

	// Poll cadence, written by run only (read after it returns).
	gaps  []time.Duration // between the sends of consecutive polls that read
	blind int             // polls that failed as a whole (Redis not answering)
}

// wantMove asks the updater to make its next update a move.
func (o *freshObserver) wantMove() { o.move.Store(true) }

// ForceMove implements benchload.UpdateHook.
func (o *freshObserver) ForceMove() bool { return o.move.Swap(false) }

// Before implements benchload.UpdateHook: it serialises the updates of one track (so that their commits return in commit
// order), reads the track's album and genre and the affected keys, and returns the function that registers the
// outcome and releases the track.
func (o *freshObserver) Before(ctx context.Context, seq int64, id int, name string, moveTo int) func(time.Time, error) {
	mu := &o.trackLocks[id%len(o.trackLocks)]
	mu.Lock()
	track := strconv.Itoa(id)
	var album, genre int
	if err := o.pool.QueryRow(ctx, "select album_id, coalesce(genre_id, 0) from track where track_id = $1", id).Scan(&album, &genre); err != nil {
		// Not knowing the album, nothing is judged; the state is still recorded, so that values are understood.
		return func(committed time.Time, err2 error) {
			newAlbum := ""
			if moveTo > 0 {
				newAlbum = strconv.Itoa(moveTo)
			}
			o.track.register(seq, track, name, newAlbum, false, committed, committed, errors.Join(err, err2), nil)
			mu.Unlock()
		}
	}
	oldAlbum, newAlbum := strconv.Itoa(album), strconv.Itoa(album)
	move := moveTo > 0 && moveTo != album
	if move {
		newAlbum = strconv.Itoa(moveTo)
	}
	want := []cachedKey{{keyspace: "track", role: roleTrack, key: track}, {keyspace: "album", role: roleAlbum, album: newAlbum, key: newAlbum}}
	if move {
		want = append(want, cachedKey{keyspace: "album", role: roleOldAlbum, album: oldAlbum, key: oldAlbum})
	}
	if genre > 0 {
		want = append(want, cachedKey{keyspace: "chart-genre", role: roleChart, key: strconv.Itoa(genre)})
	}
	var cached []cachedKey
	var cmds []*redis.StringCmd
	pipe := o.rdb.Pipeline()
	for _, w := range want {
		keys := o.keys[w.keyspace]
		if keys == nil {
			continue // the config has no such keyspace
		}
		ks, err := keys.For(w.key)
		if err != nil {
			continue
		}
		w.key = ks.Cache
		cached = append(cached, w)
		cmds = append(cmds, pipe.Get(ctx, ks.Cache))
	}
	_, _ = pipe.Exec(ctx)
	for i, c := range cmds {
		if v, err := c.Bytes(); err == nil {
			cached[i].value = v
		}
	}
	started := time.Now()
	return func(committed time.Time, err error) {
		o.track.register(seq, track, name, newAlbum, move, started, committed, err, cached)
		mu.Unlock()
	}
}

// run polls the pending keys until ctx ends: one pipelined GET of each, every interval, or less often when more
// keys are pending than budget allows (len/budget seconds).
func (o *freshObserver) run(ctx context.Context) {
	var lastRead time.Time
	wait := o.interval
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		keys := o.track.pendingKeys()
		wait = max(o.interval, time.Duration(float64(len(keys))/float64(o.budget)*float64(time.Second)))
		sent := time.Now()
		if len(keys) > 0 {
			pctx, cancel := context.WithTimeout(ctx, max(4*o.interval, time.Second))
			cmds, _ := o.rdb.Pipelined(pctx, func(p redis.Pipeliner) error {
				for _, k := range keys {
					p.Get(pctx, k)
				}
				return nil
			})
			cancel()
			reply := time.Now()
			values := make(map[string]reading, len(keys))
			for i, c := range cmds {
				v, err := c.(*redis.StringCmd).Bytes()
				switch {
				case err == nil:
					values[keys[i]] = reading{value: v, present: true}
				case errors.Is(err, redis.Nil):
					values[keys[i]] = reading{}
				}
			}
			if len(values) == 0 {
				o.blind++
				continue
			}
			o.track.observe(sent, reply, values)
		}
		if !lastRead.IsZero() {
			o.gaps = append(o.gaps, sent.Sub(lastRead))
		}
		lastRead = sent
	}
}

// cadence summarises the poller's intervals: median, 99th percentile and longest.
func cadence(gaps []time.Duration) (p50, p99, longest time.Duration) {
	if len(gaps) == 0 {
		return 0, 0, 0
	}
	return benchload.Percentile(gaps, 0.5), benchload.Percentile(gaps, 0.99), benchload.Percentile(gaps, 1)
}

// String describes a target for the report.
func (t *freshTarget) String() string { return fmt.Sprintf("%s (%s)", t.Key, t.Role) }
