package warmer

import (
	"bufio"
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
)

// A simulation of the replay that `keepwarm-bench trace` runs for real, with the tracker's selection code as is
// and everything else modelled: reads at a fixed rate, each a hit when the cached value has not expired and else a
// miss that writes it for TTL×(1+U[0,0.1)); the access set (ZINCRBY 1 per read, flushed every second; halved
// every decay_half_life in steps, trimmed to max_tracked); polls of its top 2×top_n every second and of all of it
// every minute; hot keys refreshed lead before expiry, instantly. It is for comparing selection policies in
// seconds, not a measurement of the daemon: the real replays are in docs/benchmarks.md.

type simConfig struct {
	rate       float64 // reads per second
	ttl, lead  float64 // seconds
	halfLife   float64 // seconds
	topN       int
	maxTracked int
	minScore   float64
	oracle     []int32 // pinned ids instead of top_n when set
	late       bool    // the oracle pins each of its ids only from the poll after its first read (no foresight of it)
}

type simResult struct {
	warm                      float64
	refreshes, judged, wasted int64
	feedbackJudged            int64
	feedbackWasted            int64
	meanHot                   float64
}

type simEvent struct {
	at  float64
	id  int32
	gen int32
}

type simHeap []simEvent

func (h simHeap) Len() int           { return len(h) }
func (h simHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h simHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *simHeap) Push(x any)        { *h = append(*h, x.(simEvent)) }
func (h *simHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func simulate(seq []int32, nids int, c simConfig) simResult {
	rnd := rand.New(rand.NewPCG(1, 2))
	names := make([]string, nids)
	index := make(map[string]int32, nids)
	for i := range names {
		names[i] = strconv.Itoa(i)
		index[names[i]] = int32(i)
	}
	exp := make([]float64, nids)     // cached value's expiry; 0 = absent
	score := make([]float64, nids)   // the access set; 0 = not a member
	pending := make([]float64, nids) // increments not flushed yet
	var dirty []int32                // ids with pending increments
	hotGen := make([]int32, nids)    // > 0 while hot: the hot spell's generation
	var gen int32
	var members []int32 // ids with score > 0 (may hold stale ids; filtered on use)
	inSet := make([]bool, nids)
	tr := newTracker(c.maxTracked, time.Duration(c.halfLife*float64(time.Second)))
	every := min(max(c.halfLife/10, 1), 60)
	weight := pow2(-every / c.halfLife)
	var q simHeap
	var refIDs []int32
	lastRef := make([]float64, nids)
	var refAt []float64
	res := simResult{}
	jitter := func() float64 { return c.ttl * (1 + 0.1*rnd.Float64()) }
	schedule := func(id int32, now float64) {
		due := now
		if exp[id] > now {
			due = max(now, exp[id]-c.lead*(1+0.05*rnd.Float64()))
		}
		heap.Push(&q, simEvent{due, id, hotGen[id]})
	}
	hot := map[int32]bool{}
	setHot := func(next map[string]bool, now float64) {
		for id := range hot {
			if !next[names[id]] {
				delete(hot, id)
				hotGen[id] = 0
				tr.entries[names[id]].leftHot()
			}
		}
		for name := range next {
			id := index[name]
			if hot[id] {
				continue
			}
			hot[id] = true
			gen++
			hotGen[id] = gen
			if tr.entries[name] == nil {
				tr.observe(name, 0, int64(now))
			}
			schedule(id, now)
		}
	}
	inOracle := make([]bool, nids)
	for _, id := range c.oracle {
		inOracle[id] = true
	}
	var latePins []string
	if c.oracle != nil && !c.late {
		ids := make([]string, len(c.oracle))
		for i, id := range c.oracle {
			ids[i] = names[id]
		}
		tr.setPinned(ids, 0)
		next := tr.selectHot(nil, 0, 0, 0)
		for _, id := range c.oracle {
			exp[id] = jitter() // warmed before the first read
		}
		setHot(next, 0)
	}
	poll := func(now float64, full bool) {
		live := members[:0]
		for _, id := range members {
			if inSet[id] {
				live = append(live, id)
			}
		}
		members = live
		unix := int64(now)
		if full { // the full sync observes every member, then the poll reads the top
			for _, id := range members {
				tr.observe(names[id], score[id], unix)
			}
		}
		top := members
		if window := 2 * c.topN; len(members) > window {
			ss := make([]float64, len(members))
			for i, id := range members {
				ss[i] = score[id]
			}
			slices.Sort(ss)
			cut := ss[len(ss)-window]
			top = make([]int32, 0, window)
			for _, id := range members {
				if score[id] >= cut && len(top) < window {
					top = append(top, id)
				}
			}
		}
		cands := make([]string, 0, len(top)+len(hot))
		for _, id := range top {
			tr.observe(names[id], score[id], unix)
			cands = append(cands, names[id])
		}
		for id := range hot {
			cands = append(cands, names[id])
		}
		if c.oracle == nil {
			setHot(tr.selectHot(cands, c.topN, c.minScore, unix), now)
		} else if c.late {
			tr.setPinned(latePins, unix)
			setHot(tr.selectHot(nil, 0, 0, unix), now)
		}
		tr.trim()
	}
	decay := func() {
		for _, id := range members {
			if !inSet[id] {
				continue
			}
			score[id] *= weight
			if score[id] < 0.001 {
				score[id], inSet[id] = 0, false
			}
		}
		n := 0
		for _, id := range members {
			if inSet[id] {
				n++
			}
		}
		if over := n - c.maxTracked; over > 0 {
			live := make([]int32, 0, n)
			for _, id := range members {
				if inSet[id] {
					live = append(live, id)
				}
			}
			slices.SortFunc(live, func(a, b int32) int {
				switch {
				case score[a] < score[b]:
					return -1
				case score[a] > score[b]:
					return 1
				}
				return 0
			})
			for _, id := range live[:over] {
				score[id], inSet[id] = 0, false
			}
		}
	}
	flush := func() {
		for _, id := range dirty {
			if !inSet[id] {
				inSet[id] = true
				members = append(members, id)
			}
			score[id] += pending[id]
			pending[id] = 0
		}
		dirty = dirty[:0]
	}
	refresh := func(ev simEvent) {
		if hotGen[ev.id] != ev.gen || ev.gen == 0 {
			return
		}
		now := ev.at
		if exp[ev.id]-now > 1.5*c.lead {
			schedule(ev.id, now) // fresh: someone else refreshed it
			return
		}
		exp[ev.id] = now + jitter()
		period := 0.0
		if last := lastRef[ev.id]; last > 0 {
			period = now - last
		}
		lastRef[ev.id] = now
		refIDs = append(refIDs, ev.id)
		refAt = append(refAt, now)
		j, w := tr.refreshed(tr.entries[names[ev.id]], int64(now), time.Duration(period*float64(time.Second)))
		if j {
			res.feedbackJudged++
		}
		if w {
			res.feedbackWasted++
		}
		schedule(ev.id, now)
	}
	n := len(seq)
	end := float64(n) / c.rate
	nextPoll, nextFlush, nextDecay, nextFull := 0.0, 0.5, every, 0.0
	hits := 0
	var hotSum float64
	polls := 0
	for i := 0; i <= n; i++ {
		t := end
		if i < n {
			t = float64(i) / c.rate
		}
		for {
			at := min(nextPoll, nextFlush)
			if len(q) > 0 && q[0].at < at {
				at = q[0].at
			}
			if at > t {
				break
			}
			switch {
			case len(q) > 0 && q[0].at == at:
				refresh(heap.Pop(&q).(simEvent))
			case nextFlush == at:
				flush()
				nextFlush += 1
			default:
				full := nextFull <= at
				if full {
					nextFull += 60
				}
				poll(at, full)
				if nextDecay <= at {
					decay()
					nextDecay = at + every
				}
				hotSum += float64(len(hot))
				polls++
				nextPoll += 1
			}
		}
		if i == n {
			break
		}
		id := seq[i]
		if exp[id] > t {
			hits++
		} else {
			exp[id] = t + jitter()
		}
		if pending[id] == 0 {
			dirty = append(dirty, id)
		}
		if c.late && inOracle[id] && score[id] == 0 && pending[id] == 0 {
			latePins = append(latePins, names[id])
			inOracle[id] = false
		}
		pending[id]++
	}
	res.warm = float64(hits) / float64(n)
	res.refreshes = int64(len(refIDs))
	res.meanHot = hotSum / float64(max(polls, 1))
	// Wasted, as keepwarm-bench judges it: no read of the id in (r, min(r+TTL, its next refresh)].
	reads := make([][]float64, nids)
	for i, id := range seq {
		reads[id] = append(reads[id], float64(i)/c.rate)
	}
	refs := make([][]float64, nids)
	for i, id := range refIDs {
		refs[id] = append(refs[id], refAt[i])
	}
	for id, rs := range refs {
		for j, r := range rs {
			until := r + c.ttl
			if until > end {
				continue
			}
			if j+1 < len(rs) && rs[j+1] < until {
				until = rs[j+1]
			}
			res.judged++
			k, _ := slices.BinarySearch(reads[id], r+1e-9)
			if k >= len(reads[id]) || reads[id][k] > until {
				res.wasted++
			}
		}
	}
	return res
}

func pow2(x float64) float64 { return math.Exp2(x) }

// simTrace reads an ARC trace (start_block count ...), one read per block, the first limit reads.
func simTrace(tb testing.TB, path string, limit int) ([]int32, int) {
	f, err := os.Open(path)
	if err != nil {
		tb.Fatalf("the ARC traces are in shared/data/traces beside the repository: %v", err)
	}
	defer f.Close()
	zr, err := zstd.NewReader(f)
	if err != nil {
		tb.Fatal(err)
	}
	defer zr.Close()
	index := map[int64]int32{}
	var seq []int32
	sc := bufio.NewScanner(zr)
	for sc.Scan() && len(seq) < limit {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 {
			continue
		}
		start, _ := strconv.ParseInt(fs[0], 10, 64)
		count, _ := strconv.ParseInt(fs[1], 10, 64)
		for b := start; b < start+count && len(seq) < limit; b++ {
			i, ok := index[b]
			if !ok {
				i = int32(len(index))
				index[b] = i
			}
			seq = append(seq, i)
		}
	}
	return seq, len(index)
}

func simZipf(skew float64, keys, reads int, scan float64) ([]int32, int) {
	r := rand.New(rand.NewPCG(1, 7))
	z := rand.NewZipf(r, skew, 1, uint64(keys-1))
	perm := r.Perm(keys)
	seq := make([]int32, reads)
	n := keys
	for i := range seq {
		if scan > 0 && r.Float64() < scan {
			seq[i] = int32(n)
			n++
			continue
		}
		seq[i] = int32(perm[z.Uint64()])
	}
	return seq, n
}

func simOracle(seq []int32, nids, k int) []int32 {
	counts := make([]int32, nids)
	for _, i := range seq {
		counts[i]++
	}
	idx := make([]int32, nids)
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortStableFunc(idx, func(a, b int32) int { return int(counts[b] - counts[a]) })
	return idx[:min(k, nids)]
}

// BenchmarkSelectionSimulated prints the simulated warm fraction and wasted refreshes of the selection against
// the static top-K oracle, on the first 600,000 reads of each trace, with the replay's default flags (3,000
// reads/s, TTL = length/30, decay_half_life = length/6, K = 10,000):
//
//	go test -run '^$' -bench SelectionSimulated -benchtime 1x ./warmer/
func BenchmarkSelectionSimulated(b *testing.B) {
	dir := filepath.Join("..", "..", "shared", "data", "traces")
	if d := os.Getenv("KEEPWARM_TRACES"); d != "" {
		dir = d
	}
	const limit = 600000
	type work struct {
		name string
		load func() ([]int32, int)
	}
	var ws []work
	for _, t := range []string{"OLTP", "P6", "P12"} {
		ws = append(ws, work{t, func() ([]int32, int) { return simTrace(b, filepath.Join(dir, t+".lis.zst"), limit) }})
	}
	for _, scan := range []float64{0, 0.1} {
		ws = append(ws, work{fmt.Sprintf("zipf-scan%g", scan), func() ([]int32, int) { return simZipf(1.1, 186880, limit, scan) }})
	}
	if v := os.Getenv("SIM_ADMIT"); v != "" {
		admitReads, _ = strconv.Atoi(v)
	}
	if v := os.Getenv("SIM_PATIENCE"); v != "" {
		patience, _ = strconv.ParseFloat(v, 64)
	}
	for _, w := range ws {
		b.Run(w.name, func(b *testing.B) {
			seq, nids := w.load()
			for range b.N {
				length := float64(len(seq)) / 3000
				c := simConfig{rate: 3000, ttl: float64(int(length/30*10+0.5)) / 10, halfLife: float64(int(length/6 + 0.5)),
					topN: 10000, maxTracked: 100000}
				if v := os.Getenv("SIM_HL"); v != "" {
					f, _ := strconv.ParseFloat(v, 64)
					c.halfLife *= f
				}
				c.lead = max(c.ttl/5, min(2, c.ttl/4)+0.5) // refresh_ahead raised to statement_timeout + pool_wait_timeout
				kw := simulate(seq, nids, c)
				if os.Getenv("SIM_ONLY_KEEPWARM") != "" {
					b.Logf("%s: keepwarm warm %.2f%% refreshes %d wasted %d of %d (feedback judged %d wasted %d, mean hot %.0f)",
						w.name, 100*kw.warm, kw.refreshes, kw.wasted, kw.judged, kw.feedbackJudged, kw.feedbackWasted, kw.meanHot)
					continue
				}
				c.oracle = simOracle(seq, nids, c.topN)
				or := simulate(seq, nids, c)
				c.late = true
				late := simulate(seq, nids, c)
				b.Logf("%s: oracle pinning each id from its first read: warm %.2f%% refreshes %d wasted %d of %d", w.name, 100*late.warm, late.refreshes, late.wasted, late.judged)
				b.ReportMetric(100*kw.warm, "warm%")
				b.ReportMetric(kw.warm/or.warm, "warm/oracle")
				b.ReportMetric(float64(kw.wasted), "wasted")
				b.ReportMetric(float64(kw.wasted)/float64(max(or.wasted, 1)), "wasted/oracle")
				b.Logf("%s: keepwarm warm %.2f%% refreshes %d wasted %d of %d (feedback judged %d wasted %d, mean hot %.0f); oracle warm %.2f%% refreshes %d wasted %d of %d",
					w.name, 100*kw.warm, kw.refreshes, kw.wasted, kw.judged, kw.feedbackJudged, kw.feedbackWasted, kw.meanHot,
					100*or.warm, or.refreshes, or.wasted, or.judged)
			}
		})
	}
}
