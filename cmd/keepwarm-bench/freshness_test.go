package main

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Values as the demo's queries build them (json_build_object's spacing).
func trackValue(name string) []byte {
	return []byte(fmt.Sprintf(`{"id" : 7, "name" : %q, "album" : "x"}`, name))
}

func albumValue(tracks ...string) []byte { // id=name pairs
	var es []string
	for _, t := range tracks {
		id, name, _ := strings.Cut(t, "=")
		es = append(es, fmt.Sprintf(`{"id" : %s, "name" : %q, "milliseconds" : 1}`, id, name))
	}
	return []byte(`{"id" : 1, "title" : "t", "tracks" : [` + strings.Join(es, ", ") + `]}`)
}

func chartValue(tracks ...string) []byte {
	var es []string
	for _, t := range tracks {
		id, name, _ := strings.Cut(t, "=")
		es = append(es, fmt.Sprintf(`{"rank" : 1, "track_id" : %s, "name" : %q}`, id, name))
	}
	return []byte(`{"genre_id" : 1, "top" : [` + strings.Join(es, ", ") + `]}`)
}

func TestFreshTracker(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type poll struct {
		ms     int // sent; answered 5 ms later
		values map[string]reading
	}
	present := func(v []byte) reading { return reading{value: v, present: true} }
	gone := reading{}
	// One update of track 7 to "kwb 2", committed at 0 ms, from album 1 (moved to album 2 when move is set).
	tests := []struct {
		name    string
		move    bool
		cached  []cachedKey
		earlier []string // updates of track 7 registered before (names, album 1)
		later   []string // updates registered after ours, before the polls (names; "name@album" moves)
		polls   []poll
		want    map[string]string // key → verdict
	}{
		{
			name:   "the new name within the bound",
			cached: []cachedKey{{key: "track:7", keyspace: "track", role: roleTrack, value: trackValue("Old")}},
			polls: []poll{
				{50, map[string]reading{"track:7": present(trackValue("Old"))}},
				{300, map[string]reading{"track:7": present(trackValue("kwb 2"))}},
			},
			want: map[string]string{"track:7": verdictWithin},
		},
		{
			name:   "stale at a reading sent after the bound: late",
			cached: []cachedKey{{key: "track:7", keyspace: "track", role: roleTrack, value: trackValue("Old")}},
			polls: []poll{
				{1200, map[string]reading{"track:7": present(trackValue("Old"))}},
				{1250, map[string]reading{"track:7": present(trackValue("kwb 2"))}},
			},
			want: map[string]string{"track:7": verdictLate},
		},
		{
			name:   "readings straddling the bound: borderline",
			cached: []cachedKey{{key: "track:7", keyspace: "track", role: roleTrack, value: trackValue("Old")}},
			polls: []poll{
				{900, map[string]reading{"track:7": present(trackValue("Old"))}},
				{1100, map[string]reading{"track:7": present(trackValue("kwb 2"))}},
			},
			want: map[string]string{"track:7": verdictBorderline},
		},
		{
			name:   "gone is not stale",
			cached: []cachedKey{{key: "track:7", keyspace: "track", role: roleTrack, value: trackValue("Old")}},
			polls:  []poll{{100, map[string]reading{"track:7": gone}}},
			want:   map[string]string{"track:7": verdictWithin},
		},
		{
			name:   "never fresh: never",
			cached: []cachedKey{{key: "track:7", keyspace: "track", role: roleTrack, value: trackValue("Old")}},
			polls:  []poll{{100, map[string]reading{"track:7": present(trackValue("Old"))}}},
			want:   map[string]string{"track:7": verdictNever},
		},
		{
			name:    "an earlier update's name is stale",
			earlier: []string{"kwb 1"},
			cached:  []cachedKey{{key: "track:7", keyspace: "track", role: roleTrack, value: trackValue("kwb 1")}},
			polls:   []poll{{100, map[string]reading{"track:7": present(trackValue("kwb 1"))}}},
			want:    map[string]string{"track:7": verdictNever},
		},
		{
			name:   "a later update's name is fresh (whatever its sequence number)",
			cached: []cachedKey{{key: "track:7", keyspace: "track", role: roleTrack, value: trackValue("Old")}},
			later:  []string{"kwb 1"},
			polls:  []poll{{100, map[string]reading{"track:7": present(trackValue("kwb 1"))}}},
			want:   map[string]string{"track:7": verdictWithin},
		},
		{
			name:   "a reading sent before the commit returned judges nothing",
			cached: []cachedKey{{key: "track:7", keyspace: "track", role: roleTrack, value: trackValue("Old")}},
			polls: []poll{
				{-10, map[string]reading{"track:7": gone}},
				{1300, map[string]reading{"track:7": present(trackValue("kwb 2"))}},
			},
			want: map[string]string{"track:7": verdictBorderline},
		},
		{
			name: "a move: new album lists it with the new name, old album no longer lists it",
			move: true,
			cached: []cachedKey{
				{key: "album:2", keyspace: "album", role: roleAlbum, album: "2", value: albumValue("3=Other")},
				{key: "album:1", keyspace: "album", role: roleOldAlbum, album: "1", value: albumValue("7=Old", "8=Other")},
			},
			polls: []poll{
				{100, map[string]reading{"album:2": present(albumValue("3=Other")), "album:1": present(albumValue("7=Old", "8=Other"))}},
				{200, map[string]reading{"album:2": present(albumValue("3=Other", "7=kwb 2")), "album:1": present(albumValue("7=Old", "8=Other"))}},
				{1100, map[string]reading{"album:1": present(albumValue("7=Old", "8=Other"))}},
				{1500, map[string]reading{"album:1": present(albumValue("8=Other"))}},
			},
			want: map[string]string{"album:2": verdictWithin, "album:1": verdictLate},
		},
		{
			name:  "the old album listing the track again after a later move back is fresh",
			move:  true,
			later: []string{"kwb 5@1"},
			cached: []cachedKey{
				{key: "album:1", keyspace: "album", role: roleOldAlbum, album: "1", value: albumValue("7=Old")},
			},
			polls: []poll{{100, map[string]reading{"album:1": present(albumValue("7=kwb 5"))}}},
			want:  map[string]string{"album:1": verdictWithin},
		},
		{
			name: "the album of a name change: its entry's name",
			cached: []cachedKey{
				{key: "album:1", keyspace: "album", role: roleAlbum, album: "1", value: albumValue("7=Old")},
			},
			polls: []poll{
				{100, map[string]reading{"album:1": present(albumValue("7=Old"))}},
				{150, map[string]reading{"album:1": present(albumValue("7=kwb 2"))}},
			},
			want: map[string]string{"album:1": verdictWithin},
		},
		{
			name: "a chart that lists the track is judged; one that does not is not",
			cached: []cachedKey{
				{key: "chart:genre:1", keyspace: "chart-genre", role: roleChart, value: chartValue("7=Old")},
				{key: "chart:genre:2", keyspace: "chart-genre", role: roleChart, value: chartValue("9=Other")},
			},
			polls: []poll{{100, map[string]reading{"chart:genre:1": present(chartValue("7=kwb 2")), "chart:genre:2": present(chartValue("9=Other"))}}},
			want:  map[string]string{"chart:genre:1": verdictWithin},
		},
		{
			name: "a key absent when the update committed is not judged",
			cached: []cachedKey{
				{key: "track:7", keyspace: "track", role: roleTrack},
			},
			want: map[string]string{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ft := newFreshTracker(time.Second, 100)
			for i, n := range tt.earlier {
				ft.register(int64(i), "7", n, "1", false, at(-100), at(-50), nil, nil)
			}
			album := "1"
			if tt.move {
				album = "2"
			}
			ft.register(100, "7", "kwb 2", album, tt.move, at(-5), at(0), nil, tt.cached)
			for i, n := range tt.later {
				name, alb, _ := strings.Cut(n, "@")
				if alb == "" {
					alb = album
				}
				ft.register(int64(200+i), "7", name, alb, alb != album, at(1), at(2), nil, nil)
			}
			for _, p := range tt.polls {
				ft.observe(at(p.ms), at(p.ms+5), p.values)
			}
			changes, _ := ft.finish()
			got := map[string]string{}
			for _, c := range changes {
				if c.Seq != 100 {
					continue
				}
				for _, tg := range c.Targets {
					got[tg.Key] = tg.verdict(c.Committed, time.Second)
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestFreshTrackerBounds(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ft := newFreshTracker(time.Second, 3)
	for i := range 5 {
		ft.register(int64(i), fmt.Sprint(i), "kwb", "1", false, t0, t0, nil, []cachedKey{{key: fmt.Sprintf("track:%d", i), keyspace: "track", role: roleTrack, value: []byte(`{}`)}})
	}
	ft.register(9, "9", "kwb 9", "1", false, t0, t0, fmt.Errorf("conn reset"), []cachedKey{{key: "track:9", keyspace: "track", role: roleTrack, value: []byte(`{}`)}})
	if got := ft.pendingKeys(); len(got) != 3 {
		t.Errorf("pending keys %v, want 3 (the bound)", got)
	}
	changes, skipped := ft.finish()
	if len(changes) != 5 || skipped != 2 {
		t.Errorf("%d changes (%d skipped), want 5 committed (the failed update is a state, not a change) and 2 skipped", len(changes), skipped)
	}
	// A failed update may have committed: its name is still a later state than the changes before it.
	if got := ft.tracks["9"].index("kwb 9"); got != 0 {
		t.Errorf("index of the failed update's name %d, want 0", got)
	}
	// The interval grows with the pending keys beyond the budget: cadence reports what the polls did.
	if p50, p99, longest := cadence([]time.Duration{50 * time.Millisecond, 50 * time.Millisecond, 2 * time.Second}); p50 != 50*time.Millisecond || p99 != 2*time.Second || longest != 2*time.Second {
		t.Errorf("cadence: %v %v %v", p50, p99, longest)
	}
}
