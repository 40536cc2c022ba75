package warmer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func TestLead(t *testing.T) {
	t.Parallel()
	base := KeyspaceConfig{TTL: 60 * time.Second, RefreshAhead: 5 * time.Second, LeadMultiple: 3,
		StatementTimeout: 2 * time.Second, PoolWaitTimeout: 500 * time.Millisecond}
	tests := []struct {
		name    string
		edit    func(*KeyspaceConfig)
		rebuild time.Duration
		want    time.Duration
	}{
		{"refresh_ahead wins", nil, time.Second, 5 * time.Second},
		{"slow rebuild wins", nil, 2 * time.Second, 6 * time.Second},
		{"no rebuild yet", nil, 0, 5 * time.Second},
		{"origin bound wins", func(c *KeyspaceConfig) { c.RefreshAhead = time.Second }, 0, 2500 * time.Millisecond},
		{"capped at half the TTL", nil, time.Minute, 30 * time.Second},
		{"huge estimate is capped at half the TTL", nil, math.MaxInt64 / 2, 30 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base
			if tt.edit != nil {
				tt.edit(&c)
			}
			if got := c.Lead(tt.rebuild); got != tt.want {
				t.Errorf("Lead(%v) = %v, want %v", tt.rebuild, got, tt.want)
			}
		})
	}
}

func TestDueAt(t *testing.T) {
	t.Parallel()
	exp := time.Unix(1000, 0)
	ld := 4 * time.Second
	t.Run("u=1 gives exactly expiry-lead", func(t *testing.T) {
		if got, want := dueAt(exp, ld, time.Second, 1), exp.Add(-ld); !got.Equal(want) {
			t.Errorf("got %v, want %v", got, want)
		}
	})
	t.Run("offset capped at lead/2", func(t *testing.T) {
		if got, want := dueAt(exp, ld, time.Hour, 1e-9), exp.Add(-ld-ld/2); !got.Equal(want) {
			t.Errorf("got %v, want %v", got, want)
		}
	})
	t.Run("offset is delta*-ln(u)", func(t *testing.T) {
		u := 0.5
		want := exp.Add(-ld - time.Duration(float64(time.Second)*-math.Log(u)))
		if got := dueAt(exp, ld, time.Second, u); !got.Equal(want) {
			t.Errorf("got %v, want %v", got, want)
		}
	})
	t.Run("never after expiry-lead", func(t *testing.T) {
		for _, u := range []float64{0, 1e-12, 0.1, 0.5, 0.99, 1, 2} {
			if got := dueAt(exp, ld, 300*time.Millisecond, u); got.After(exp.Add(-ld)) {
				t.Errorf("u=%v: due %v after expiry-lead %v", u, got, exp.Add(-ld))
			}
		}
	})
}

func TestDueQueueOrder(t *testing.T) {
	t.Parallel()
	base := time.Unix(1000, 0)
	var q dueQueue
	mk := func(id string, score float64) *hotState {
		return &hotState{id: id, e: &entry{score: score}, idx: -1}
	}
	a, b, c, d := mk("a", 1), mk("b", 9), mk("c", 5), mk("d", 1)
	q.schedule(a, base.Add(3*time.Second))
	q.schedule(b, base.Add(1*time.Second))
	q.schedule(c, base.Add(1*time.Second))
	q.schedule(d, base.Add(10*time.Second))
	// Move d to the front: rescheduling must fix the heap, not add a second copy.
	q.schedule(d, base)
	if q.Len() != 4 {
		t.Fatalf("len = %d, want 4", q.Len())
	}
	got := q.popDue(base.Add(5*time.Second), 10)
	var order string
	for _, h := range got {
		order += h.id
	}
	// d is due first; b and c are due together and the hotter b goes first; a last.
	if want := "dbca"; order != want {
		t.Errorf("order = %q, want %q", order, want)
	}
	for _, h := range got {
		if h.idx != -1 {
			t.Errorf("%s: idx = %d after pop, want -1", h.id, h.idx)
		}
	}
}

func TestDueQueueBudget(t *testing.T) {
	t.Parallel()
	// More keys due than one batch can take: the nearest expiries go first, the rest stay queued in order.
	base := time.Unix(1000, 0)
	var q dueQueue
	for i := 0; i < 10; i++ {
		q.schedule(&hotState{id: fmt.Sprint(i), e: &entry{}, idx: -1}, base.Add(time.Duration(9-i)*time.Second))
	}
	first := q.popDue(base.Add(time.Hour), 3)
	if len(first) != 3 || first[0].id != "9" || first[1].id != "8" || first[2].id != "7" {
		t.Fatalf("first batch = %v, want ids 9,8,7", ids(first))
	}
	if q.Len() != 7 {
		t.Fatalf("left %d, want 7", q.Len())
	}
	if got := q.popDue(base.Add(500*time.Millisecond), 100); len(got) != 0 {
		t.Errorf("popped %v not yet due", ids(got))
	}
	q.remove(q.peek())
	if got := q.peek().id; got != "5" {
		t.Errorf("after remove, head = %s, want 5", got)
	}
}

// TestDueQueueCountBy: the pruned count of keys due by a time equals a scan of the whole queue, for every cut,
// on a queue whose times repeat and whose order was disturbed by reschedules and removals.
func TestDueQueueCountBy(t *testing.T) {
	t.Parallel()
	base := time.Unix(1000, 0)
	rnd := rand.New(rand.NewPCG(7, 7))
	var q dueQueue
	var all []*hotState
	for i := range 2000 {
		h := &hotState{id: fmt.Sprint(i), e: &entry{}, idx: -1}
		all = append(all, h)
		q.schedule(h, base.Add(time.Duration(rnd.IntN(500))*time.Millisecond))
	}
	for _, h := range all[:300] {
		q.schedule(h, base.Add(time.Duration(rnd.IntN(500))*time.Millisecond))
	}
	for _, h := range all[300:400] {
		q.remove(h)
	}
	for cut := -10; cut <= 510; cut += 7 {
		until := base.Add(time.Duration(cut) * time.Millisecond)
		want := 0
		for _, h := range q.keys {
			if !h.due.After(until) {
				want++
			}
		}
		if got := q.countBy(until); got != want {
			t.Fatalf("countBy(+%dms) = %d, want %d (a scan of the %d queued)", cut, got, want, q.Len())
		}
	}
}

func ids(hs []*hotState) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.id
	}
	return out
}

func TestRebuildEstimate(t *testing.T) {
	t.Parallel()
	var h hotState
	h.observeRebuild(100 * time.Millisecond)
	h.observeRebuild(400 * time.Millisecond)
	if h.rebuildP95 != 400*time.Millisecond {
		t.Fatalf("p95 after a slow rebuild = %v, want 400ms", h.rebuildP95)
	}
	for i := 0; i < 200; i++ {
		h.observeRebuild(100 * time.Millisecond)
	}
	if h.rebuildP95 > 110*time.Millisecond || h.rebuildP95 < 100*time.Millisecond {
		t.Errorf("p95 after many fast rebuilds = %v, want ~100ms", h.rebuildP95)
	}
	var w rebuildWindow
	for i := 1; i <= 100; i++ {
		w.add(time.Duration(i) * time.Millisecond)
	}
	if got := w.p95(); got != 96*time.Millisecond {
		t.Errorf("window p95 = %v, want 96ms", got)
	}
}

func TestTrackerSelectAndTrim(t *testing.T) {
	t.Parallel()
	tr := newTracker(5, time.Minute, 0, 0)
	tr.setPinned([]string{"p"}, 0)
	for i, s := range []float64{1, 50, 3, 40, 0.5, 30} {
		tr.observe(fmt.Sprintf("k%d", i), s/2, 0) // two polls that saw the score rise: admitted
		tr.observe(fmt.Sprintf("k%d", i), s, 0)
	}
	hot := tr.selectHot([]string{"k0", "k1", "k2", "k3", "k4", "k5"}, 2, 2, 0)
	want := map[string]bool{"p": true, "k1": true, "k3": true}
	if fmt.Sprint(hot) != fmt.Sprint(want) {
		t.Errorf("hot = %v, want %v", hot, want)
	}
	// Mark the hot ones so trim keeps them; 7 entries, bound 5: the two coldest non-hot leave.
	for id := range hot {
		tr.entries[id].hot = &hotState{}
	}
	if n := tr.trim(); n != 2 {
		t.Fatalf("trim removed %d, want 2", n)
	}
	for _, gone := range []string{"k4", "k0"} {
		if _, ok := tr.entries[gone]; ok {
			t.Errorf("%s (coldest) still tracked", gone)
		}
	}
	for _, kept := range []string{"p", "k1", "k3", "k5", "k2"} {
		if _, ok := tr.entries[kept]; !ok {
			t.Errorf("%s dropped", kept)
		}
	}
	// Unpinning returns the id and clears the flag.
	if un := tr.setPinned(nil, 0); len(un) != 1 || un[0] != "p" || tr.entries["p"].pinned {
		t.Errorf("unpinned = %v, pinned flag %v", un, tr.entries["p"].pinned)
	}
}

func TestMatcher(t *testing.T) {
	t.Parallel()
	m := newMatcher("{track}:${id}:v1")
	if id, ok := m.id("{track}:42:v1"); !ok || id != "42" {
		t.Errorf("id = %q, %v", id, ok)
	}
	if _, ok := m.id("{album}:42:v1"); ok {
		t.Error("matched another keyspace")
	}
	if got, want := m.pattern(), `{track}:*:v1`; got != want {
		t.Errorf("pattern = %q, want %q", got, want)
	}
	if got, want := newMatcher("a*[x]:${id}").pattern(), `a\*\[x\]:*`; got != want {
		t.Errorf("escaped pattern = %q, want %q", got, want)
	}
	if newMatcher("${id}:${id}") != nil {
		t.Error("two ${id}: want no matcher")
	}
}

// A retry after a transient Redis failure (TRYAGAIN, ASK, MOVED, CLUSTERDOWN) or a lock held elsewhere is never
// scheduled after the value's known expiry: a 2–4 s back-off drawn 1 s before the expiry would let the value
// expire, as it did for 44 ms in a slot migration.
func TestRetryAtNeverAfterExpiry(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	rebuild := 200 * time.Millisecond
	for _, tc := range []struct {
		name   string
		delay  time.Duration
		expiry time.Time
		want   time.Time
	}{
		{"back-off well before the expiry", time.Second, now.Add(10 * time.Second), now.Add(time.Second)},
		{"back-off past the expiry: brought forward", 3 * time.Second, now.Add(time.Second), now.Add(time.Second - rebuild - retryMargin)},
		{"expiry too close: the floor", 3 * time.Second, now.Add(100 * time.Millisecond), now.Add(lockedRecheckMin)},
		{"expiry unknown: full back-off", 3 * time.Second, time.Time{}, now.Add(3 * time.Second)},
		{"value already expired: full back-off", 3 * time.Second, now.Add(-time.Second), now.Add(3 * time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := retryAt(now, tc.delay, tc.expiry, rebuild); !got.Equal(tc.want) {
				t.Errorf("retryAt = now%+v, want now%+v", got.Sub(now), tc.want.Sub(now))
			}
		})
	}
}
