package benchload

import (
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/lockstep"
)

// TestSpaceStats: record counts each outcome, keeps per-id counts and hot-when-read counts only after the
// warm-up, bounds the latencies by MaxLatencies, and Stats returns a sorted copy that later reads do not change.
func TestSpaceStats(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	ls := &Space{Name: "track", perID: map[string]*IDStats{}, MaxLatencies: 4}
	reads := []struct {
		id             string
		outcome        int
		lat            time.Duration
		err            error
		afterWarm, hot bool
	}{
		{"1", outcomeHit, 5 * time.Millisecond, nil, false, true},   // in the warm-up: totals only
		{"1", outcomeMiss, 3 * time.Millisecond, nil, true, true},   // hot, missed
		{"1", outcomeHit, 1 * time.Millisecond, nil, true, true},    // hot, hit
		{"2", outcomeStale, 4 * time.Millisecond, nil, true, false}, // a stale serve is a miss too
		{"3", outcomeHit, 2 * time.Millisecond, boom, true, false},  // beyond MaxLatencies
		{"4", outcomeMiss, 9 * time.Millisecond, lockstep.ErrNotFound, true, false},
	}
	for _, r := range reads {
		ls.record(r.id, r.outcome, r.lat, r.err, r.afterWarm, r.hot)
	}
	ls.appRebuilds.Add(2)
	got := ls.Stats()
	want := Stats{Reads: 6, Hits: 3, Misses: 3, Stale: 1, Errors: 1, FirstErr: boom,
		Latencies:    []time.Duration{time.Millisecond, 3 * time.Millisecond, 4 * time.Millisecond, 5 * time.Millisecond},
		LiveHotReads: 2, LiveHotMisses: 1, AppRebuilds: 2,
		PerID: map[string]IDStats{"1": {2, 1}, "2": {1, 1}, "3": {1, 0}, "4": {1, 1}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
	ls.record("1", outcomeHit, time.Millisecond, nil, true, false)
	if got.Reads != 6 || got.PerID["1"].Reads != 2 {
		t.Errorf("a later read changed an earlier Stats(): %+v", got)
	}
	if top, want := ls.TopRead(1), map[string]bool{"1": true}; !reflect.DeepEqual(top, want) {
		t.Errorf("TopRead(1) = %v, want %v", top, want)
	}
}

// TestSpaceConcurrent: many readers record while another goroutine takes Stats, under -race.
func TestSpaceConcurrent(t *testing.T) {
	t.Parallel()
	ls := &Space{Name: "track", perID: map[string]*IDStats{}}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				ls.record(string(rune('a'+w)), i%3, time.Microsecond, nil, true, i%2 == 0)
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 50 {
			_ = ls.Stats()
			_ = ls.TopRead(3)
		}
	}()
	wg.Wait()
	<-done
	if got, want := ls.Stats().Reads, 8*500; got != want {
		t.Errorf("Reads = %d, want %d", got, want)
	}
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	d := []time.Duration{5, 1, 4, 2, 3}
	tests := []struct {
		q    float64
		want time.Duration
	}{{0, 1}, {0.5, 3}, {0.99, 5}, {1, 5}}
	for _, tt := range tests {
		if got := Percentile(d, tt.q); got != tt.want {
			t.Errorf("Percentile(%v, %v) = %v, want %v", d, tt.q, got, tt.want)
		}
	}
	if !reflect.DeepEqual(d, []time.Duration{5, 1, 4, 2, 3}) {
		t.Errorf("Percentile sorted its argument: %v", d)
	}
	if got := Percentile(nil, 0.5); got != 0 {
		t.Errorf("Percentile(nil) = %v, want 0", got)
	}
}
