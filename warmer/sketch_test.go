package warmer

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestSketchNeverUnderestimates: a count-min sketch's estimate is at least the true count (collisions only add),
// here with 50,000 ids in a sketch sized for 10,000 tracked ids, Zipf-distributed adds; and collisions stay rare
// for ids never added.
func TestSketchNeverUnderestimates(t *testing.T) {
	t.Parallel()
	s := newFrequencySketch(10000, time.Hour, 0)
	r := rand.New(rand.NewPCG(1, 2))
	z := rand.NewZipf(r, 1.1, 1, 49999)
	truth := map[string]int{}
	for range 100000 {
		id := strconv.FormatUint(z.Uint64(), 10)
		truth[id]++
		s.add(id, 1)
	}
	over := 0
	for id, n := range truth {
		got := int(s.estimate(id))
		if got < min(n, 255) {
			t.Fatalf("id %s: estimate %d below its %d adds", id, got, n)
		}
		if got > n {
			over++
		}
	}
	never := 0
	for i := range 10000 {
		if s.estimate("never"+strconv.Itoa(i)) > 0 {
			never++
		}
	}
	// 100,000 adds into 4 rows of 32,768 counters: the false "read before" rate must stay small, or the sketch
	// would admit ids read once (the doorkeeper's promise).
	if never > 500 {
		t.Errorf("%d of 10000 ids never added have a non-zero estimate, want ≤ 5%%", never)
	}
	t.Logf("%d of %d ids overestimated; %d of 10000 never-added ids estimated > 0", over, len(truth), never)
}

func TestSketchSaturatesAndHalves(t *testing.T) {
	t.Parallel()
	s := newFrequencySketch(100, 10*time.Second, 1000)
	s.add("a", 300)
	if got := s.estimate("a"); got != 255 {
		t.Errorf("after 300 adds estimate = %d, want 255 (saturated)", got)
	}
	s.add("b", 40)
	s.age(1009) // less than a half-life: nothing changes
	if got := s.estimate("b"); got != 40 {
		t.Errorf("before a half-life estimate = %d, want 40", got)
	}
	s.age(1010)
	if got := s.estimate("b"); got != 20 {
		t.Errorf("after one half-life estimate = %d, want 20", got)
	}
	s.age(1035) // 2.5 half-lives later: halved twice, and the next halving is due at 1040, not 1045
	if got := s.estimate("b"); got != 5 {
		t.Errorf("after two more half-lives estimate = %d, want 5", got)
	}
	s.age(1039)
	if got := s.estimate("b"); got != 5 {
		t.Errorf("at 1039 estimate = %d, want 5 (next halving at 1040)", got)
	}
	s.age(1040)
	if got := s.estimate("b"); got != 2 {
		t.Errorf("at 1040 estimate = %d, want 2", got)
	}
}

// TestSketchRateMatchesTheAccessScale: for a steady read rate λ, the sketch's rate and the access score agree
// (λ·decay/ln 2), within the sawtooth of halving in steps (≤ 6%) and rounding.
func TestSketchRateMatchesTheAccessScale(t *testing.T) {
	t.Parallel()
	decay, hist := 30*time.Second, 180*time.Second
	s := newFrequencySketch(100, hist, 0)
	const lambda = 0.5 // reads per second
	want := lambda * decay.Seconds() / 0.6931471805599453
	for now := int64(1); now <= 2000; now++ {
		s.age(now)
		if now%2 == 0 {
			s.add("a", 1)
		}
		if now > 1000 { // steady state
			if got := s.rate("a", now, decay); got < 0.9*want || got > 1.12*want {
				t.Fatalf("at %d s: rate %.2f, want %.2f ± 10%%", now, got, want)
			}
		}
	}
}

// TestSketchRemembersTrimmedIDs: an id whose entry was trimmed between two reads is admitted at its second read
// with the sketch, as if its entry had stayed; without it, it starts again from nothing.
func TestSketchRemembersTrimmedIDs(t *testing.T) {
	t.Parallel()
	for _, hist := range []time.Duration{0, 6 * time.Minute} {
		tr := newTracker(1, time.Minute, hist, 0)
		tr.observe("a", 1, 0)
		tr.observe("b", 5, 0)
		tr.trim() // "a" is the coldest: its entry leaves
		if tr.entries["a"] != nil {
			t.Fatal("trim kept the coldest entry")
		}
		tr.age(30)
		tr.observe("a", 1, 30) // read again
		admitted := tr.selectHot([]string{"a"}, 10, 0, 30)["a"]
		if admitted != (hist > 0) {
			t.Errorf("history_half_life %v: admitted at its second read = %v, want %v", hist, admitted, hist > 0)
		}
	}
}

// TestLongHistoryOutranksOneRecentRead: with the sketch, an id read in several polls a minute apart ranks above
// ids read twice just now, although its decayed access score is below theirs; without it, it ranks below.
func TestLongHistoryOutranksOneRecentRead(t *testing.T) {
	t.Parallel()
	for _, hist := range []time.Duration{0, 3 * time.Minute} {
		tr := newTracker(100, 30*time.Second, hist, 0)
		score := 0.0
		for now := int64(0); now <= 240; now += 60 { // five reads a minute apart; the set halves every 30 s
			tr.age(now)
			score = score/4 + 1
			tr.observe("regular", score, now)
		}
		tr.observe("burst", 2, 240) // two reads just now: admitted, and a higher access score
		// One slot: which id takes it?
		hot := tr.selectHot([]string{"regular", "burst"}, 1, 0, 240)
		if hot["regular"] != (hist > 0) {
			t.Errorf("history_half_life %v: hot = %v", hist, hotIDs(hot))
		}
	}
}

// TestLFUPassesTheDoorkeeper: an LFU counter of 1 above Redis's initial value (a key written and read once) is one
// read's evidence, which does not admit; a rise of 2 or more is two, which does.
func TestLFUPassesTheDoorkeeper(t *testing.T) {
	t.Parallel()
	tr := newTracker(100, time.Minute, 6*time.Minute, 0)
	tr.observeLFU("once", 1, 0)
	tr.observeLFU("often", 3, 0)
	tr.observeLFU("twice", 1, 0)
	tr.observeLFU("twice", 1, 1) // the same counter again: no new read
	hot := tr.selectHot([]string{"once", "often", "twice"}, 10, 0, 1)
	if got, want := hotIDs(hot), []string{"often"}; !slices.Equal(got, want) {
		t.Errorf("hot = %v, want %v", got, want)
	}
	tr.observeLFU("twice", 2, 2) // read again
	if hot := tr.selectHot([]string{"twice"}, 10, 0, 2); !hot["twice"] {
		t.Error("an LFU counter that rose again did not admit")
	}
}

// TestSketchMemoryPerTrackedID keeps the sketch inside the memory bound's budget: 8 to 16 bytes per tracked id.
func TestSketchMemoryPerTrackedID(t *testing.T) {
	t.Parallel()
	for _, n := range []int{10000, 100000, 1000000} {
		if b := newFrequencySketch(n, time.Hour, 0).bytes(); float64(b)/float64(n) > 16 {
			t.Errorf("max_tracked %d: sketch %d bytes, %.1f per tracked id, want ≤ 16", n, b, float64(b)/float64(n))
		}
	}
}

// TestResizeKeepsHistoryWhenItCan: a reload that changes history_half_life keeps the counts; one that changes
// max_tracked enough to change the sketch's width starts them again; history_half_life 0 turns the sketch off.
func TestResizeKeepsHistoryWhenItCan(t *testing.T) {
	t.Parallel()
	tr := newTracker(10000, time.Minute, time.Hour, 0)
	tr.sketch.add("a", 3)
	tr.resize(10000, 2*time.Hour, 0)
	if got := tr.sketch.estimate("a"); got != 3 || tr.sketch.halfLife != 2*time.Hour {
		t.Errorf("after a history_half_life change: estimate %d (want 3), half-life %v (want 2h)", got, tr.sketch.halfLife)
	}
	tr.resize(100000, 2*time.Hour, 0)
	if got := tr.sketch.estimate("a"); got != 0 || tr.sketch.bytes() != 4*int(sketchWidth(100000)) {
		t.Errorf("after a max_tracked change: estimate %d (want 0), %d bytes", got, tr.sketch.bytes())
	}
	if tr.resize(100000, 0, 0); tr.sketch != nil {
		t.Error("history_half_life 0 left the sketch on")
	}
}

// TestRecreatedEntryIsNotCountedTwice: an entry trimmed and re-created starts at score 0, so its first rise is the
// id's whole access score; only the reads the sketch has not counted yet go in (found in review: 5 reads, a trim
// and one more read estimated 11).
func TestRecreatedEntryIsNotCountedTwice(t *testing.T) {
	t.Parallel()
	tr := newTracker(1, time.Minute, time.Hour, 0)
	for i := 1; i <= 5; i++ {
		tr.observe("a", float64(i), int64(i))
	}
	delete(tr.entries, "a") // as trim does
	tr.observe("a", 6, 6)
	if got := tr.sketch.estimate("a"); got != 6 {
		t.Errorf("estimate %d after 6 reads, want 6", got)
	}
}

// TestNewSketchDoesNotDemote: after a reload that starts the sketch again (max_tracked changed its width), a hot
// id with no count yet is judged by its recent score, not demoted as if it had no reads at all.
func TestNewSketchDoesNotDemote(t *testing.T) {
	t.Parallel()
	tr := newTracker(100, time.Minute, time.Hour, 0)
	tr.observe("a", 50, 0)
	e := tr.observe("a", 100, 0) // read often: expected gap 0.87 s at this score
	tr.resize(100000, time.Hour, 0)
	tr.refreshed("a", e, 0, 0)
	for range minWasted {
		tr.refreshed("a", e, 0, time.Second/10) // unread, but for far less than patience × the expected gap
	}
	if e.flags.reads() < admitReads {
		t.Error("demoted after two unread refreshes 0.1 s apart: the empty sketch was read as no reads at all")
	}
}

// TestRisenIDsDoNotPileUp: the ids read since the last selection are candidates once; a poll that does not
// select (the hot set is frozen during an origin outage) drops them at the next poll's start, so an outage of
// any length cannot grow the list.
func TestRisenIDsDoNotPileUp(t *testing.T) {
	t.Parallel()
	tr := newTracker(1000, time.Minute, time.Hour, 0)
	for now := int64(1); now <= 50; now++ { // 50 polls that read signals and never select
		tr.age(now)
		for i := range 100 {
			tr.observe(strconv.Itoa(i), float64(now), now)
		}
	}
	if got := len(tr.risen); got > 100 {
		t.Errorf("risen holds %d ids after 50 polls without a selection, want at most one poll's 100", got)
	}
}
