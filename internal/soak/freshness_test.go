package soak

import (
	"context"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/benchload"
	"github.com/keepwarm/keepwarm/internal/redisserver"
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

func TestParseCounters(t *testing.T) {
	page := `# HELP keepwarm_changes_late_total Changed keys published late.
keepwarm_changes_late_total{keyspace="album"} 3
keepwarm_changes_late_total{keyspace="track"} 2
keepwarm_changes_stale_seconds_total{keyspace="track"} 4.5
keepwarm_stream_old_ids_unknown_total 7
keepwarm_stream_resyncs_total{reason="publication_gap"} 1
keepwarm_stream_resyncs_total{reason="created"} 1
keepwarm_warmer_hot_expired_total{keyspace="track"} 12
keepwarm_changes_late_totally{keyspace="track"} 99
`
	got, err := parseCounters(strings.NewReader(page))
	want := counterSet{"late/album": 3, "late/track": 2, "stale_seconds/track": 4.5, "old_ids_unknown/": 7,
		"resyncs/publication_gap": 1, "resyncs/created": 1, "hot_expired/track": 12}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, %v; want %v", got, err, want)
	}
	if got := got.sub(counterSet{"late/track": 1}).of("late"); !reflect.DeepEqual(got, map[string]float64{"album": 3, "track": 1}) {
		t.Errorf("sub and of: %v", got)
	}
}

// freshResult is a soak result with one fault of kind at 40 s (in force 40–60 s) and the given changes,
// committed after the warm-up; the counters are given as totals at the end (zero at the start and at the fault).
func freshResult(kind string, final counterSet, changes ...*freshChange) *soakResult {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	fr := faultRecord{plannedFault: plannedFault{At: 40 * time.Second, Kind: kind}, started: at(40), ended: at(60),
		counterAt: map[string]float64{}, totalsAt: counterSet{}, outer: [2]time.Time{at(40), at(60)}, inner: [2]time.Time{at(41), at(59)}}
	return &soakResult{seed: 7, start: t0, warmEnd: at(30), end: at(120), faults: []faultRecord{fr}, freshBound: time.Second,
		totalsBase: counterSet{}, totalsFinal: final, fresh: changes, freshGaps: []time.Duration{50 * time.Millisecond}}
}

// lateChange is a change of track 7 committed at sec seconds, with one key resolved lo..hi seconds later.
func lateChange(sec float64, role, key string, lo, hi float64, absent, move bool) *freshChange {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := t0.Add(time.Duration(sec * float64(time.Second)))
	ks := "track"
	if strings.HasPrefix(key, "album") {
		ks = "album"
	}
	return &freshChange{Track: "7", Name: "kwb", Started: c.Add(-time.Millisecond), Committed: c, Move: move,
		Targets: []*freshTarget{{Key: key, Keyspace: ks, Role: role, Resolved: true, Absent: absent,
			Lo: c.Add(time.Duration(lo * float64(time.Second))), Hi: c.Add(time.Duration(hi * float64(time.Second))), Poll: int64(sec * 1000)}}}
}

func TestFreshAccount(t *testing.T) {
	late := func(sec float64) *freshChange { return lateChange(sec, roleTrack, "track:7", 2, 2.1, false, false) }
	tests := []struct {
		name      string
		kind      string
		final     counterSet
		changes   []*freshChange
		events    map[string]int
		explained map[string]int
		staleLo   float64
	}{
		{"a late key must be counted", faultRedisOOM, counterSet{"late/track": 1, "stale_seconds/track": 2}, []*freshChange{late(45)},
			map[string]int{"track": 1}, map[string]int{}, 2},
		{"keys resolved at one poll are one event", faultRedisOOM, nil,
			[]*freshChange{late(45), func() *freshChange {
				c := late(45.5)
				c.Targets[0].Poll, c.Targets[0].Lo = 45000, c.Committed.Add(1500*time.Millisecond)
				return c
			}()},
			map[string]int{"track": 1}, map[string]int{}, 1.5},
		{"a key gone first is explained", faultRedisOOM, nil, []*freshChange{lateChange(45, roleTrack, "track:7", 2, 2.1, true, false)},
			map[string]int{}, map[string]int{causeGone: 1}, 0},
		{"an old album during an identity flip is explained; the new album is not", faultIdentityFlip, nil,
			[]*freshChange{lateChange(45, roleOldAlbum, "album:1", 5, 5.1, false, true), lateChange(46, roleAlbum, "album:2", 3, 3.1, false, true)},
			map[string]int{"album": 1}, map[string]int{causeOldUnknown: 1}, 3},
		{"an old album outside the flip is not explained", faultIdentityFlip, nil,
			[]*freshChange{lateChange(65, roleOldAlbum, "album:1", 5, 5.1, false, true)},
			map[string]int{"album": 1}, map[string]int{}, 5},
		{"a publication gap's change resolved by the resync is explained", faultPubRecreate, nil,
			[]*freshChange{lateChange(50, roleTrack, "track:7", 5, 5.1, false, false)},
			map[string]int{}, map[string]int{causePubGap: 1}, 0},
		{"a publication gap's change resolved long after the resync is not", faultPubRecreate, nil,
			[]*freshChange{lateChange(50, roleTrack, "track:7", 25, 25.1, false, false)},
			map[string]int{"track": 1}, map[string]int{}, 25},
		{"changes of the warm-up are left out", faultRedisOOM, nil, []*freshChange{late(10)}, map[string]int{}, map[string]int{}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := freshAccount(freshResult(tt.kind, tt.final, tt.changes...))
			if !reflect.DeepEqual(s.events, tt.events) || !reflect.DeepEqual(s.explained, tt.explained) {
				t.Errorf("events %v, explained %v; want %v, %v", s.events, s.explained, tt.events, tt.explained)
			}
			if got := sumOf(s.staleLo); got < tt.staleLo-1e-9 || got > tt.staleLo+1e-9 {
				t.Errorf("least stale seconds %v, want %v", got, tt.staleLo)
			}
		})
	}
	// The flip's updates: sent and committed inside the inner window.
	s := freshAccount(freshResult(faultIdentityFlip, nil, lateChange(45, roleAlbum, "album:2", 0, 0.1, false, true), late(40.5), late(59.5)))
	if s.flipUpdates != 1 || s.flipMoves != 1 || s.committed != 3 || s.within != 1 {
		t.Errorf("flip updates %d, moves %d, committed %d, within %d; want 1, 1, 3, 1", s.flipUpdates, s.flipMoves, s.committed, s.within)
	}
	if s.rows[faultIdentityFlip].committed != 3 || s.rows[faultIdentityFlip].late != 2 {
		t.Errorf("row %+v", *s.rows[faultIdentityFlip])
	}
}

// TestFreshChecksCanFail: each freshness check fails on its own defect and names it.
func TestFreshChecksCanFail(t *testing.T) {
	f := Options{FreshMaxP99: 500 * time.Millisecond}
	run := func(r *soakResult) []string {
		var failed []string
		freshAccount(r).checks(r, f, func(ok bool, name, got, detail string) {
			if !ok {
				failed = append(failed, name+": "+got+": "+detail)
			}
		})
		return failed
	}
	ok := lateChange(45, roleTrack, "track:7", 0, 0.2, false, false)
	late := lateChange(45, roleTrack, "track:7", 2, 2.1, false, false)
	counted := counterSet{"late/track": 1, "stale_seconds/track": 2.5}
	tests := []struct {
		name string
		r    *soakResult
		want string // "" = every check passes
	}{
		{"clean", freshResult(faultRedisOOM, nil, ok), ""},
		{"a late key counted", freshResult(faultRedisOOM, counted, late), ""},
		{"nothing judged", freshResult(faultRedisOOM, nil, &freshChange{Committed: ok.Committed}), "vacuously"},
		{"a slow observer", func() *soakResult {
			r := freshResult(faultRedisOOM, nil, ok)
			r.freshGaps = slices.Repeat([]time.Duration{2 * time.Second}, 10)
			return r
		}(), "cadence"},
		{"never visible", freshResult(faultRedisOOM, nil, func() *freshChange {
			c := lateChange(45, roleTrack, "track:7", 0, 0, false, false)
			c.Targets[0].Resolved = false
			return c
		}()), "never visible"},
		{"a late key not counted", freshResult(faultRedisOOM, counterSet{"stale_seconds/track": 2.5}, late), "track: 1 late keys observed, 0 counted"},
		{"stale seconds not counted", freshResult(faultRedisOOM, counterSet{"late/track": 1, "stale_seconds/track": 1}, late), "at least 2.0 s observed"},
		{"a flip's updates not counted", freshResult(faultIdentityFlip, nil, lateChange(45, roleAlbum, "album:2", 0, 0.1, false, true)), "old_ids_unknown"},
		{"a flip's updates counted", freshResult(faultIdentityFlip, counterSet{"old_ids_unknown/": 1}, lateChange(45, roleAlbum, "album:2", 0, 0.1, false, true)), ""},
		{"a publication gap not covered", freshResult(faultPubRecreate, counterSet{"late/track": 1, "stale_seconds/track": 25},
			lateChange(50, roleTrack, "track:7", 25, 25.1, false, false)), "publication gaps covered"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			failed := run(tt.r)
			switch {
			case tt.want == "" && len(failed) > 0:
				t.Errorf("failed %v, want every check to pass", failed)
			case tt.want != "" && !slices.ContainsFunc(failed, func(s string) bool { return strings.Contains(s, tt.want) }):
				t.Errorf("failed %v, want a failure containing %q", failed, tt.want)
			}
		})
	}
}

// TestStallStandby gives the soak's PostgreSQL its synchronous standby and stalls it as the pg-sync-standby-stall
// fault does: a commit sent during the stall returns only after it, the fault sees it waiting (it bites), and
// remove leaves no server behind.
func TestStallStandby(t *testing.T) {
	ctx := context.Background()
	pg, err := startPostgres(ctx, io.Discard)
	if err != nil {
		t.Fatalf("%v (scripts/services up installs PostgreSQL)", err)
	}
	t.Cleanup(pg.remove)
	if err := pg.addStandby(ctx, io.Discard); err != nil {
		t.Fatal(err)
	}
	if err := pg.srv.Exec(ctx, "postgres", "create database chinook"); err != nil {
		t.Fatal(err)
	}
	if err := pg.srv.Exec(ctx, "chinook", "create table t (x int)"); err != nil {
		t.Fatal(err)
	}
	s := &soak{pg: pg, counters: map[incarnation]counterSet{}}
	r := &faultRecord{plannedFault: plannedFault{Kind: faultSyncStall, Length: 3 * time.Second}, totalsAt: counterSet{}}
	type result struct {
		sent, returned time.Time
		err            error
	}
	done := make(chan result, 1)
	go func() {
		time.Sleep(500 * time.Millisecond) // within the stall
		sent := time.Now()
		err := pg.srv.Exec(ctx, "chinook", "insert into t values (1)")
		done <- result{sent, time.Now(), err}
	}()
	detail, err := s.stallStandby(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	got := <-done
	if got.err != nil {
		t.Fatal(got.err)
	}
	if r.noBite != "" || !strings.Contains(detail, "up to 1 commits waiting") {
		t.Errorf("detail %q, noBite %q; want one commit seen waiting", detail, r.noBite)
	}
	// inner[1] is taken just before SIGCONT, outer[1] just after: the commit may return between the two (it did,
	// 31 µs before outer[1], beside stress-ng), not before the walreceiver is resumed.
	if got.returned.Before(r.inner[1]) {
		t.Errorf("the commit sent at +%v returned at +%v, before the stall ended (SIGCONT sent after +%v)", got.sent.Sub(r.outer[0]),
			got.returned.Sub(r.outer[0]), r.inner[1].Sub(r.outer[0]))
	}
	dirs := []string{pg.srv.DataDir(), pg.standby.DataDir()}
	pg.remove()
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still there after remove (%v)", d, err)
		}
	}
}

// TestRedisOOM runs the redis-oom fault on a private redis-server while a writer fills it: writes are refused
// for memory during the fault (it bites), and maxmemory and the policy are restored after it.
func TestRedisOOM(t *testing.T) {
	ctx := context.Background()
	srv, err := redisserver.Start(ctx)
	if err != nil {
		t.Fatalf("%v (scripts/services up installs redis-server)", err)
	}
	t.Cleanup(srv.Stop)
	rdb, err := benchload.NewRedis(ctx, srv.URL, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "allkeys-lfu").Err(); err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	var refused atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; wctx.Err() == nil; i++ {
			if err := rdb.Set(wctx, fmt.Sprintf("k:%d", i), strings.Repeat("x", 1000), 0).Err(); err != nil && strings.HasPrefix(err.Error(), "OOM") {
				refused.Add(1)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	s := &soak{rdb: rdb}
	r := &faultRecord{plannedFault: plannedFault{Kind: faultRedisOOM, Length: time.Second}}
	detail, err := s.redisOOM(ctx, r)
	stop()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if r.noBite != "" || refused.Load() == 0 {
		t.Errorf("detail %q, noBite %q, the writer saw %d refusals; want refusals", detail, r.noBite, refused.Load())
	}
	cfg, err := rdb.ConfigGet(ctx, "maxmemory*").Result()
	if err != nil || cfg["maxmemory"] != "0" || cfg["maxmemory-policy"] != "allkeys-lfu" {
		t.Errorf("after the fault: %v, %v; want maxmemory 0 and allkeys-lfu restored", cfg, err)
	}
}
