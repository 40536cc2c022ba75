package warmer

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/keepwarm/keepwarm/warmer/internal/mailbox"
)

// KeyStatus is the state of one hot key, as /debug/hotkeys and the status page show it.
type KeyStatus struct {
	ID          string        `json:"id"`
	Key         string        `json:"key"`
	Pinned      bool          `json:"pinned"`
	Score       float64       `json:"score"`
	TTL         time.Duration `json:"ttl_ns"`       // TTL left by the daemon's estimate; 0 when unknown or missing
	NextRefresh time.Time     `json:"next_refresh"` // zero when not queued
	LastRefresh time.Time     `json:"last_refresh"` // zero before the daemon's first refresh
	LastRebuild time.Duration `json:"last_rebuild_ns"`
	Refreshing  bool          `json:"refreshing"` // a refresh batch holds the key right now
	Persistent  bool          `json:"persistent"` // the key has no TTL and is left alone
	Missing     bool          `json:"missing"`    // the origin had no row at the last refresh
	// Owned is true when this replica refreshes the key (always without a fleet); a hot key's SLO is its
	// owner's (docs/operations.md, "The SLO, precisely").
	Owned bool `json:"owned"`
	// HotSince is when the key last entered this replica's hot set (a key that leaves it and comes back starts
	// again): a key that went missing before its owner's HotSince was not a hot key of its owner when it did.
	HotSince time.Time `json:"hot_since"`
	// OwnedSince is when this replica last came to own the key while it was hot (zero when Owned is false): at
	// HotSince, or later when a fleet member left, or when this replica's heartbeat lapsed in a stall and was
	// renewed (its heirs owned the key in between). A gap that began before it was not this replica's to prevent.
	OwnedSince time.Time `json:"owned_since"`
	LastError  string    `json:"last_error,omitempty"`
}

// MarshalJSON encodes s as its fields' JSON, except that an ID or Key that is not valid UTF-8 is written with
// its invalid bytes escaped as Go does (`\xff`; a backslash as `\\`), with "id_escaped": true, instead of
// encoding/json's U+FFFD, which would make different bad ids look alike. Valid ids are written as they are.
func (s KeyStatus) MarshalJSON() ([]byte, error) {
	type fields KeyStatus // the same fields without this method
	out := struct {
		fields
		IDEscaped bool `json:"id_escaped,omitempty"`
	}{fields: fields(s)}
	if !utf8.ValidString(s.ID) || !utf8.ValidString(s.Key) {
		out.ID, out.Key, out.IDEscaped = escapeInvalid(s.ID), escapeInvalid(s.Key), true
	}
	return json.Marshal(out)
}

// escapeInvalid returns s Go-quoted, without the quotes: an injective, printable form of any byte string.
func escapeInvalid(s string) string {
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

// KeyspaceStatus summarises one keyspace.
type KeyspaceStatus struct {
	Name string `json:"name"`
	// KeyTemplate is the keyspace's cache-key template, such as "track:${id}" (not a key).
	KeyTemplate string `json:"key_template"`
	Tracked     int    `json:"tracked"`
	Hot         int    `json:"hot"`
	// Owned is how many of the hot keys this replica refreshes; the fleet's other replicas own the rest.
	Owned int `json:"owned"`
	Due   int `json:"due"`
	// Refreshes counts refresh attempts since start by result (ok, fresh, locked, missing, lock_lost, error).
	Refreshes map[string]int64 `json:"refreshes"`
	// HotExpired is the SLO counter: hot keys that expired before their refresh. It should stay at 0.
	HotExpired int64 `json:"hot_expired"`
	// RefreshesJudged and RefreshesWasted count, since start, the refreshes the refresh feedback judged at the
	// key's next refresh and those no read followed (selection.go); WastedRatio is wasted / judged over a window
	// that fades with decay_half_life, as the metric keepwarm_warmer_wasted_refresh_ratio.
	RefreshesJudged int64   `json:"refreshes_judged"`
	RefreshesWasted int64   `json:"refreshes_wasted"`
	WastedRatio     float64 `json:"wasted_ratio"`
	// LFU is true while the LFU signal is on: the keyspace asks for it and Redis's maxmemory-policy, as last
	// checked, is an LFU policy.
	LFU bool `json:"lfu"`
	// CheckError is set while the keyspace's source check fails (see Checker): nothing is refreshed until it passes.
	CheckError string `json:"check_error,omitempty"`
	// AsOf is when the keyspace's loop took this state. It is the call's time unless the loop was busy past
	// statusWait (a Redis call hanging, say): then it is the last state the loop published, and says how old.
	AsOf time.Time   `json:"as_of"`
	Keys []KeyStatus `json:"keys"` // nearest expiry first, at most the limit asked for
	// Left are the keys that left the hot set within the last LeftKeep (at most the latest leftMax), oldest
	// first: when each stopped being hot, which the hot set alone cannot say to an observer that reads it once
	// a second (the soak's miss observer judges a gap a hot key's by them).
	Left []LeftKey `json:"left,omitempty"`
}

// LeftKey is a key that left the hot set: its id, when it became hot and when it left (this replica's clock),
// whether this replica owned it then, and since when (KeyStatus.OwnedSince; zero when not owned).
type LeftKey struct {
	ID         string    `json:"id"`
	HotSince   time.Time `json:"hot_since"`
	LeftAt     time.Time `json:"left_at"`
	Owned      bool      `json:"owned"`
	OwnedSince time.Time `json:"owned_since"`
}

// leftEntry is one key of the left-keys log: what Status reports, and the state the key had when it left, which a
// flush noticed later judges (rereadOwned).
type leftEntry struct {
	LeftKey
	h *hotState
}

// LeftKeep is how long a key that left the hot set stays in KeyspaceStatus.Left; leftMax bounds their number.
const (
	LeftKeep = 30 * time.Second
	leftMax  = 4096
)

// noteLeft records that h, owned or not, left the hot set at now (KeyspaceStatus.Left). At leftMax entries the older half goes
// at once, so that a poll in which 100,000 keys leave (top_n lowered by a reload) costs O(1) a key; entries older
// than LeftKeep stay until then, and snapshot leaves them out.
func (k *loopState) noteLeft(h *hotState, now time.Time, owned bool) {
	if len(k.leftLog) >= leftMax {
		k.leftLog = append(k.leftLog[:0], k.leftLog[len(k.leftLog)/2:]...)
	}
	l := LeftKey{ID: h.id, HotSince: h.hotSince, LeftAt: now, Owned: owned}
	if owned {
		l.OwnedSince = h.ownedSince
	}
	k.leftLog = append(k.leftLog, leftEntry{LeftKey: l, h: h})
}

// Status returns every keyspace's state, keyspaces by name, each with up to limit hot keys (nearest expiry
// first; unknown expiries last). limit ≤ 0 means all.
func (w *Warmer) Status(limit int) []KeyspaceStatus {
	spaces := w.keyspaces()
	out := make([]KeyspaceStatus, 0, len(spaces))
	now := w.now()
	for _, k := range spaces {
		st := k.status(now, limit)
		if f, ok := w.checkFailure(k); ok {
			st.CheckError = f.Error
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b KeyspaceStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// statusWait bounds how long Status waits for a keyspace's loop before it answers with the loop's last published
// state: a status page must answer while Redis hangs.
const statusWait = time.Second

// status asks k's loop for its state (a message) and returns it with up to limit hot keys; when the loop does not
// answer within statusWait, the state it last published (see KeyspaceStatus.AsOf). Sorting and cutting to limit
// happen here, off the loop.
func (k *keyspace) status(now time.Time, limit int) KeyspaceStatus {
	ctx, cancel := context.WithTimeout(context.Background(), statusWait)
	defer cancel()
	// On a timeout, the last one published.
	_ = mailbox.Do(ctx, k.mail, func(k *loopState) { k.published.Store(k.snapshot(now)) })
	p := k.published.Load()
	if p == nil {
		return KeyspaceStatus{Name: k.name, KeyTemplate: k.config().Keys.Cache.String(), HotExpired: k.hotExpired.Load()}
	}
	st := *p // the published state is never written again: copy what is sorted or cut
	st.Keys = slices.Clone(p.Keys)
	sortKeyStatus(st.Keys)
	if limit > 0 && len(st.Keys) > limit {
		st.Keys = st.Keys[:limit]
	}
	return st
}

// snapshot is the keyspace's state at now, hot keys unsorted; run on the loop.
func (k *loopState) snapshot(now time.Time) *KeyspaceStatus {
	st := KeyspaceStatus{AsOf: now, Name: k.cfg.Name, KeyTemplate: k.cfg.Keys.Cache.String(), Tracked: len(k.tr.entries),
		Hot: len(k.hotSet), Refreshes: make(map[string]int64, len(k.results)), HotExpired: k.hotExpired.Load(),
		LFU: k.lfu.enabled, Owned: k.owned(), RefreshesJudged: k.waste.totalJudged,
		RefreshesWasted: k.waste.totalWasted, WastedRatio: k.waste.ratio}
	for r, n := range k.results {
		st.Refreshes[r] = n.Load()
	}
	keys := make([]KeyStatus, 0, len(k.hotSet))
	for id, h := range k.hotSet {
		ks := KeyStatus{ID: id, Key: k.cfg.Keys.Cache.Expand(id, ""), Pinned: h.e.pinned, Score: h.e.score,
			LastRefresh: h.lastRefresh, LastRebuild: h.lastRebuild, Refreshing: h.inflight, Persistent: h.persistent,
			Missing: h.missing, Owned: k.owns(id), HotSince: h.hotSince,
			LastError: h.lastErr}
		if ks.Owned {
			ks.OwnedSince = h.ownedSince
		}
		if !h.expiry.IsZero() {
			ks.TTL = max(h.expiry.Sub(now), 0)
		}
		if h.idx >= 0 {
			ks.NextRefresh = h.due
			if !h.due.After(now) {
				st.Due++
			}
		}
		keys = append(keys, ks)
	}
	st.Keys = keys
	for _, l := range k.leftLog {
		if now.Sub(l.LeftAt) <= LeftKeep {
			st.Left = append(st.Left, l.LeftKey)
		}
	}
	return &st
}

// sortKeyStatus sorts keys nearest expiry first, unknown expiries last, then by id.
func sortKeyStatus(keys []KeyStatus) {
	slices.SortFunc(keys, func(a, b KeyStatus) int {
		ua, ub := a.TTL == 0, b.TTL == 0
		switch {
		case ua != ub:
			if ua {
				return 1
			}
			return -1
		case a.TTL != b.TTL:
			if a.TTL < b.TTL {
				return -1
			}
			return 1
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
}
