package warmer

import (
	"bufio"
	"cmp"
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
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
	history    float64 // history_half_life in seconds; 0: no frequency sketch
	oracle     []int32 // pinned ids instead of top_n when set
	late       bool    // the oracle pins each of its ids only from the poll after its first read (no foresight of it)
	// exact, when set, replaces the tracker with an online ranker that has the exact, unbounded history of every
	// read (see exactRanker); the hot set is its top_n, chosen again at every poll.
	exact *exactRanker
}

// exactRanker is one of the reference online rankers: at every poll the hot set is the top_n ids
// among those read at least admit times so far, ranked by what kind says, from the exact history of reads.
type exactRanker struct {
	kind  string  // "lfu": all reads so far; "decay": reads faded with half-life param; "window": reads in the last param seconds
	param float64 // seconds
	admit int
}

func (r *exactRanker) String() string {
	switch r.kind {
	case "lfu":
		return fmt.Sprintf("lfu/admit%d", r.admit)
	default:
		return fmt.Sprintf("%s %gs/admit%d", r.kind, r.param, r.admit)
	}
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
	tr := newTracker(c.maxTracked, time.Duration(c.halfLife*float64(time.Second)), time.Duration(c.history*float64(time.Second)), 0)
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
	// setHot does what keyspace.setHot does to the tracker: a hot id's entry carries its hotState (so trim never
	// drops it), and loses it and its refresh feedback when it leaves.
	setHot := func(next map[string]bool, now float64) {
		for id := range hot {
			if !next[names[id]] {
				delete(hot, id)
				hotGen[id] = 0
				e := tr.entries[names[id]]
				e.hot = nil
				e.leftHot()
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
			e := tr.entries[name]
			if e == nil {
				e = tr.observe(name, 0, int64(now))
			}
			e.hot = &hotState{id: name, e: e}
			schedule(id, now)
		}
	}
	// The exact rankers' history: every read, as it happens.
	var (
		nreads   []int32   // per id: nreads so far (lfu), or in the window
		faded    []float64 // per id: Σ 2^(t/param) over its nreads (decay: the order of the faded counts at any now)
		ranked   []int32   // ids read at least once
		tail     int       // window: the first read still inside it
		exactIn  []bool
		lastRead []float64
	)
	if c.exact != nil {
		nreads = make([]int32, nids)
		faded = make([]float64, nids)
		exactIn = make([]bool, nids)
		lastRead = make([]float64, nids)
	}
	exactRead := func(id int32, t float64) {
		nreads[id]++
		if c.exact.kind == "decay" {
			faded[id] += math.Exp2(t / c.exact.param)
		}
		lastRead[id] = t
		if !exactIn[id] {
			exactIn[id] = true
			ranked = append(ranked, id)
		}
	}
	exactPoll := func(now float64) {
		if c.exact.kind == "window" {
			for ; tail < len(seq) && float64(tail)/c.rate < now-c.exact.param; tail++ {
				nreads[seq[tail]]--
			}
		}
		key := func(id int32) float64 {
			switch c.exact.kind {
			case "decay":
				return faded[id]
			default:
				return float64(nreads[id])
			}
		}
		cands := make([]int32, 0, len(ranked))
		for _, id := range ranked {
			if int(nreads[id]) >= max(c.exact.admit, 1) {
				cands = append(cands, id)
			}
		}
		slices.SortFunc(cands, func(a, b int32) int {
			ka, kb := key(a), key(b)
			switch {
			case ka > kb:
				return -1
			case ka < kb:
				return 1
			}
			return cmp.Compare(lastRead[b], lastRead[a]) // the most recently read first
		})
		ids := make([]string, 0, c.topN)
		for _, id := range cands[:min(len(cands), c.topN)] {
			ids = append(ids, names[id])
		}
		tr.setPinned(ids, int64(now))
		setHot(tr.selectHot(nil, 0, 0, int64(now)), now)
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
		tr.age(unix) // as loopState.poll does, before the poll's reads go in
		if full {    // the full sync observes every member, then the poll reads the top
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
		if c.exact != nil {
			exactPoll(now)
		} else if c.oracle == nil {
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
		j, w := tr.refreshed(names[ev.id], tr.entries[names[ev.id]], int64(now), time.Duration(period*float64(time.Second)))
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
		if c.exact != nil {
			exactRead(id, t)
		}
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

// simWorkload is one read sequence of the simulation: a trace file's first reads, or a Zipf workload.
type simWorkload struct {
	name string
	load func() ([]int32, int)
}

// simWorkloads lists every trace in dir (*.lis and *.lis.zst, ARC's format: start_block count ...; orm-busy is in
// it too, one line per read) and the Zipf workloads, each cut to its first limit reads, kept to the names in only
// when only is non-empty.
func simWorkloads(tb testing.TB, dir string, limit int, only []string) []simWorkload {
	paths, _ := filepath.Glob(filepath.Join(dir, "*.lis.zst"))
	more, _ := filepath.Glob(filepath.Join(dir, "*.lis"))
	paths = append(paths, more...)
	if len(paths) == 0 {
		tb.Fatalf("no traces (*.lis, *.lis.zst) in %s: the ARC traces are in shared/data/traces beside the repository; set KEEPWARM_TRACES to a folder of traces", dir)
	}
	var ws []simWorkload
	for _, p := range paths {
		name := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(p), ".zst"), ".lis")
		ws = append(ws, simWorkload{name, func() ([]int32, int) { return simTrace(tb, p, limit) }})
	}
	for _, scan := range []float64{0, 0.1} {
		ws = append(ws, simWorkload{fmt.Sprintf("zipf-scan%g", scan), func() ([]int32, int) { return simZipf(1.1, 186880, limit, scan) }})
	}
	if len(only) == 0 {
		return ws
	}
	var kept []simWorkload
	for _, w := range ws {
		if slices.Contains(only, w.name) {
			kept = append(kept, w)
		}
	}
	if len(kept) != len(only) {
		names := make([]string, len(ws))
		for i, w := range ws {
			names[i] = w.name
		}
		tb.Fatalf("SIM_TRACES=%s: have %s", strings.Join(only, ","), strings.Join(names, ", "))
	}
	return kept
}

// exactRankers are the reference online rankers, with exact and unbounded history, for decay half-life hl: LFU,
// exact decayed counts at 1, 3 and 6 half-lives, and reads in the last 3 half-lives (100 s at the replay's 33 s),
// each admitting ids read once or only those read twice. The reference is the best of them.
func exactRankers(hl float64) []*exactRanker {
	var rs []*exactRanker
	for _, admit := range []int{1, 2} {
		rs = append(rs, &exactRanker{kind: "lfu", admit: admit})
		for _, f := range []float64{1, 3, 6} {
			rs = append(rs, &exactRanker{kind: "decay", param: f * hl, admit: admit})
		}
		rs = append(rs, &exactRanker{kind: "window", param: 3 * hl, admit: admit})
	}
	return rs
}

// BenchmarkSelectionSimulated prints, for each workload, the simulated warm fraction and wasted refreshes of the
// static top-K oracle, of the best exact online ranker (exactRankers), and of keepwarm's selection without the
// frequency sketch and with it, on the first 600,000 reads, with the replay's default flags
// (3,000 reads/s, TTL = length/30, decay_half_life = length/6, K = 10,000):
//
//	KEEPWARM_TRACES=$PWD/../shared/data/traces go test -run '^$' -bench SelectionSimulated -benchtime 1x ./warmer/
//
// KEEPWARM_TRACES is the folder of traces (every *.lis and *.lis.zst in it); SIM_TRACES=OLTP,P6 keeps some of
// the workloads (the traces' base names, zipf-scan0, zipf-scan0.1); SIM_LIMIT the reads per workload;
// SIM_HISTORY the history_half_life in multiples of the half-life (default DefaultHistoryFactor); SIM_EXACT=0
// leaves the exact rankers out (the slowest part); SIM_ADMIT, SIM_PATIENCE and SIM_HL (a factor on the half-life)
// override the selection's parameters.
func BenchmarkSelectionSimulated(b *testing.B) {
	dir := filepath.Join("..", "..", "shared", "data", "traces")
	if d := os.Getenv("KEEPWARM_TRACES"); d != "" {
		dir = d
	}
	limit := 600000
	if v := os.Getenv("SIM_LIMIT"); v != "" {
		limit, _ = strconv.Atoi(v)
	}
	var only []string
	if v := os.Getenv("SIM_TRACES"); v != "" {
		only = strings.Split(v, ",")
	}
	history := float64(DefaultHistoryFactor)
	if v := os.Getenv("SIM_HISTORY"); v != "" {
		history, _ = strconv.ParseFloat(v, 64)
	}
	if v := os.Getenv("SIM_ADMIT"); v != "" {
		admitReads, _ = strconv.Atoi(v)
	}
	if v := os.Getenv("SIM_PATIENCE"); v != "" {
		patience, _ = strconv.ParseFloat(v, 64)
	}
	for _, w := range simWorkloads(b, dir, limit, only) {
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
				// The runs are independent: as many at once as there are cores.
				type run struct {
					name string
					c    simConfig
					res  simResult
				}
				before, after := c, c
				after.history = history * c.halfLife
				oracle := c
				oracle.oracle = simOracle(seq, nids, c.topN)
				late := oracle
				late.late = true
				runs := []*run{{name: "oracle", c: oracle}, {name: "before", c: before}, {name: "after", c: after}, {name: "oracle pinning each id from its first read", c: late}}
				if os.Getenv("SIM_EXACT") != "0" {
					for _, r := range exactRankers(c.halfLife) {
						e := c
						e.exact = r
						runs = append(runs, &run{name: "exact " + r.String(), c: e})
					}
				}
				var wg sync.WaitGroup
				sem := make(chan struct{}, runtime.GOMAXPROCS(0))
				for _, r := range runs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						sem <- struct{}{}
						defer func() { <-sem }()
						r.res = simulate(seq, nids, r.c)
					}()
				}
				wg.Wait()
				or, bf, af := runs[0].res, runs[1].res, runs[2].res
				best := run{name: "exact: none run"}
				fmt.Printf("%s: %s warm %.2f%% refreshes %d wasted %d of %d\n", w.name, runs[3].name, 100*runs[3].res.warm, runs[3].res.refreshes, runs[3].res.wasted, runs[3].res.judged)
				for _, r := range runs[4:] {
					fmt.Printf("%s: %s warm %.2f%% refreshes %d wasted %d of %d\n", w.name, r.name, 100*r.res.warm, r.res.refreshes, r.res.wasted, r.res.judged)
					if r.res.warm > best.res.warm {
						best = *r
					}
				}
				line := func(name string, r simResult) string {
					return fmt.Sprintf("%s warm %.2f%% (%.3f of the oracle, %.3f of the exact ranker) refreshes %d wasted %d of %d (%.3f of the oracle's), mean hot %.0f",
						name, 100*r.warm, r.warm/or.warm, r.warm/max(best.res.warm, 1e-9), r.refreshes, r.wasted, r.judged,
						float64(r.wasted)/float64(max(or.wasted, 1)), r.meanHot)
				}
				b.Logf("%s (%d reads over %d ids; TTL %.1fs, half-life %.0fs, history_half_life %.0fs):\n  oracle warm %.2f%% refreshes %d wasted %d of %d\n  best %s warm %.2f%% (%.3f of the oracle) wasted %d\n  %s\n  %s",
					w.name, len(seq), nids, c.ttl, c.halfLife, after.history, 100*or.warm, or.refreshes, or.wasted, or.judged,
					best.name, 100*best.res.warm, best.res.warm/or.warm, best.res.wasted, line("before", bf), line("after", af))
				b.ReportMetric(100*af.warm, "warm%")
				b.ReportMetric(af.warm/or.warm, "warm/oracle")
				if best.res.warm > 0 {
					b.ReportMetric(af.warm/best.res.warm, "warm/exact")
				}
				b.ReportMetric(float64(af.wasted)/float64(max(or.wasted, 1)), "wasted/oracle")
				b.ReportMetric(100*(af.warm-bf.warm), "after-before_pt")
			}
		})
	}
}
