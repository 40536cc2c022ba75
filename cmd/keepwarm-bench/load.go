package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/assemble"
	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/sources/postgres"
	"github.com/keepwarm/keepwarm/warmer"
)

type loadFlags struct {
	config     string
	duration   time.Duration
	warmup     time.Duration
	workers    int
	zipf       float64
	keyspaces  string
	sample     float64
	daemonAddr string
	seed       uint64
}

func runLoad(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f loadFlags
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.config, "config", "config.toml", "keepwarm config file")
	fs.DurationVar(&f.duration, "duration", 2*time.Minute, "how long to run")
	fs.DurationVar(&f.warmup, "warmup", 15*time.Second, "reads in this first window are left out of the hot-key miss count")
	fs.IntVar(&f.workers, "workers", 50, "concurrent readers, each with its own lockstep client (one app process each)")
	fs.Float64Var(&f.zipf, "zipf", 1.1, "Zipf exponent s (> 1) of the id popularity")
	fs.StringVar(&f.keyspaces, "keyspaces", "", "comma-separated keyspaces to read (default: all with an ids_query)")
	fs.Float64Var(&f.sample, "sample", 1, "access-recording sample rate in (0,1]")
	fs.StringVar(&f.daemonAddr, "daemon", "127.0.0.1:9471", "the daemon's HTTP address, to learn its hot set ('' to skip)")
	fs.Uint64Var(&f.seed, "seed", 1, "random seed")
	if err := parse(fs, args); err != nil {
		return err
	}
	if f.zipf <= 1 {
		return usageError{fmt.Errorf("--zipf %v: must be > 1", f.zipf)}
	}
	if f.workers < 1 || f.duration <= 0 || f.sample <= 0 || f.sample > 1 {
		return usageError{errors.New("--workers must be >= 1, --duration > 0, --sample in (0,1]")}
	}
	cfg, err := config.Load(f.config)
	if err != nil {
		return err
	}
	rdb, err := assemble.Redis(ctx, cfg, 5*time.Second)
	if err != nil {
		return err
	}
	defer rdb.Close()
	pool, err := assemble.Postgres(ctx, cfg, 5*time.Second)
	if err != nil {
		return err
	}
	defer pool.Close()
	srcs, err := assemble.Sources(pool, cfg)
	if err != nil {
		return err
	}
	var spaces []*loadSpace
	for _, ks := range cfg.Keyspaces {
		if f.keyspaces != "" && !slices.Contains(strings.Split(f.keyspaces, ","), ks.Name) {
			continue
		}
		if ks.IDsQuery == "" {
			if f.keyspaces != "" {
				return fmt.Errorf("keyspace %q has no ids_query: the load generator needs one to know the ids", ks.Name)
			}
			continue
		}
		ls, err := newLoadSpace(ctx, rdb, ks, srcs[ks.Name], f)
		if err != nil {
			return err
		}
		spaces = append(spaces, ls)
	}
	if len(spaces) == 0 {
		return errors.New("no keyspace to read (each needs an ids_query)")
	}
	fmt.Fprintf(stderr, "load: %d workers, %v, zipf %v over %s\n", f.workers, f.duration, f.zipf, names(spaces))

	start := time.Now()
	warmEnd := start.Add(f.warmup)
	rctx, cancel := context.WithTimeout(ctx, f.duration)
	defer cancel()
	var sampler ttlSampler
	var hotNow atomic.Pointer[map[string]map[string]bool] // the daemon's hot set, re-read every second
	var wg sync.WaitGroup
	if f.daemonAddr != "" {
		if h, _ := daemonHot(f.daemonAddr); h != nil {
			hotNow.Store(&h)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-rctx.Done():
					return
				case <-t.C:
				}
				if h, _ := daemonHot(f.daemonAddr); h != nil {
					hotNow.Store(&h)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		sampler.run(rctx, rdb, spaces)
	}()
	clients, setupErr := startWorkers(rctx, &wg, rdb, spaces, f, warmEnd, func(ks, id string) bool {
		h := hotNow.Load()
		return h != nil && (*h)[ks][id]
	})
	wg.Wait()
	for _, c := range clients {
		_ = c.Close(context.Background())
	}
	if setupErr != nil {
		return setupErr
	}
	elapsed := time.Since(start)

	hot, source := daemonHot(f.daemonAddr)
	for _, ls := range spaces {
		if h, ok := hot[ls.name]; ok {
			ls.hot = h
		} else {
			ls.hot = ls.topRead(ls.topN)
			source = "top_n most-read ids of this run (daemon not reachable)"
		}
		for _, id := range cfg.Pinned(ls.name) {
			ls.hot[id] = true
		}
	}
	report(stdout, spaces, elapsed, f, source)
	sampler.report(stdout, spaces)
	return nil
}

// startWorkers starts f.workers readers on wg, each with its own lockstep client per keyspace and its own Zipf
// draw (seeded from f.seed and its number), reading until ctx ends; hot says whether an id was hot at the moment
// of a read. It returns the clients, which the caller closes after wg.Wait, and the first error setting them up
// (the workers started before it run on).
func startWorkers(ctx context.Context, wg *sync.WaitGroup, rdb redis.UniversalClient, spaces []*loadSpace, f loadFlags,
	warmEnd time.Time, hot func(ks, id string) bool) ([]*lockstep.Client, error) {
	var clients []*lockstep.Client
	for w := 0; w < f.workers; w++ {
		wk := &worker{r: rand.New(rand.NewPCG(f.seed, uint64(w)))}
		cs := make([]*lockstep.Client, len(spaces))
		for i, ls := range spaces {
			c, err := ls.client(rdb, wk, f.sample)
			if err != nil {
				return clients, err
			}
			cs[i] = c
			clients = append(clients, c)
		}
		zipfs := make([]*rand.Zipf, len(spaces))
		for i, ls := range spaces {
			zipfs[i] = rand.NewZipf(wk.r, f.zipf, 1, uint64(len(ls.ids)-1))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				i := n % len(spaces)
				ls := spaces[i]
				id := ls.ids[zipfs[i].Uint64()]
				wk.outcome = outcomeHit
				t0 := time.Now()
				_, err := cs[i].Get(ctx, id)
				lat := time.Since(t0)
				if ctx.Err() != nil {
					return
				}
				ls.record(id, wk.outcome, lat, err, t0.After(warmEnd), hot(ls.name, id))
			}
		}()
	}
	return clients, nil
}

// Outcomes of one Get, as the worker's recorder saw them.
const (
	outcomeHit = iota
	outcomeMiss
	outcomeStale
)

// worker is one reader; its recorder sees only its own Gets, so it can tell each Get's outcome.
type worker struct {
	r       *rand.Rand
	outcome int
}

// workerRecorder is a lockstep.Recorder that marks the current Get's outcome on its worker.
type workerRecorder struct {
	lockstep.NopRecorder
	w  *worker
	ls *loadSpace
}

func (r workerRecorder) Miss(string) {
	if r.w.outcome == outcomeHit {
		r.w.outcome = outcomeMiss
	}
}
func (r workerRecorder) StaleServe(string) { r.w.outcome = outcomeStale }
func (r workerRecorder) Rebuild(_ string, _ time.Duration, result string) {
	if result == lockstep.ResultOK {
		r.ls.appRebuilds.Add(1)
	}
}

// loadSpace is one keyspace under load, with its results.
type loadSpace struct {
	name string
	ks   *config.Keyspace
	src  *postgres.Source
	ids  []string
	topN int

	mu        sync.Mutex
	reads     int
	hits      int
	misses    int
	stale     int
	errs      int
	firstErr  error
	latencies []time.Duration
	maxLat    int                 // keep at most this many latencies (0: all), to bound a long run's memory
	perID     map[string]*idStats // reads and misses after the warm-up window
	hot       map[string]bool
	// reads (and misses) after the warm-up of ids that the daemon held hot at the moment of the read
	liveHotReads, liveHotMisses int

	appRebuilds atomic.Int64
}

type idStats struct{ reads, misses int }

func newLoadSpace(ctx context.Context, rdb redis.UniversalClient, ks *config.Keyspace, src *postgres.Source, f loadFlags) (*loadSpace, error) {
	ls := &loadSpace{name: ks.Name, ks: ks, src: src, topN: ks.TopN, perID: map[string]*idStats{}}
	err := src.IDs(ctx, func(id string) error {
		ls.ids = append(ls.ids, id)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(ls.ids) < 2 {
		return nil, fmt.Errorf("keyspace %q: ids_query returned %d ids; need at least 2", ks.Name, len(ls.ids))
	}
	// Shuffle so that popularity is not tied to id order (which the daemon must not rely on).
	r := rand.New(rand.NewPCG(f.seed, 99))
	r.Shuffle(len(ls.ids), func(i, j int) { ls.ids[i], ls.ids[j] = ls.ids[j], ls.ids[i] })
	return ls, nil
}

func (ls *loadSpace) client(rdb redis.UniversalClient, w *worker, sample float64) (*lockstep.Client, error) {
	load := loaderOf(ls.src)
	opts := []lockstep.Option{
		lockstep.WithJitter(ls.ks.Jitter),
		lockstep.WithLockTTL(ls.ks.LockTTL),
		lockstep.WithAccessRecording(sample),
		lockstep.WithRecorder(workerRecorder{w: w, ls: ls}),
		lockstep.WithLogger(slog.New(slog.DiscardHandler)),
	}
	if ls.ks.StaleTTL > 0 && !ls.ks.Keys().Stale.IsZero() {
		opts = append(opts, lockstep.WithStale(ls.ks.StaleTTL))
	}
	return lockstep.New(rdb, ls.name, ls.ks.Keys(), load, ls.ks.TTL, opts...)
}

// record counts one read. hotNow says whether the daemon held id hot when it was read.
func (ls *loadSpace) record(id string, outcome int, lat time.Duration, err error, afterWarmup, hotNow bool) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.reads++
	if ls.maxLat == 0 || len(ls.latencies) < ls.maxLat {
		ls.latencies = append(ls.latencies, lat)
	}
	if err != nil && !errors.Is(err, lockstep.ErrNotFound) {
		ls.errs++
		if ls.firstErr == nil {
			ls.firstErr = err
		}
	}
	switch outcome {
	case outcomeHit:
		ls.hits++
	case outcomeMiss:
		ls.misses++
	case outcomeStale:
		ls.misses++
		ls.stale++
	}
	if afterWarmup {
		s := ls.perID[id]
		if s == nil {
			s = &idStats{}
			ls.perID[id] = s
		}
		s.reads++
		if outcome != outcomeHit {
			s.misses++
		}
		if hotNow {
			ls.liveHotReads++
			if outcome != outcomeHit {
				ls.liveHotMisses++
			}
		}
	}
}

// topRead returns the n most-read ids after the warm-up.
func (ls *loadSpace) topRead(n int) map[string]bool {
	type kv struct {
		id string
		n  int
	}
	var all []kv
	for id, s := range ls.perID {
		all = append(all, kv{id, s.reads})
	}
	slices.SortFunc(all, func(a, b kv) int { return b.n - a.n })
	out := map[string]bool{}
	for i := 0; i < len(all) && i < n; i++ {
		out[all[i].id] = true
	}
	return out
}

// daemonHot asks the daemon for its hot set: keyspace → id → true.
func daemonHot(addr string) (map[string]map[string]bool, string) {
	st := daemonStatus(addr, 3*time.Second)
	if st == nil {
		return nil, ""
	}
	out := map[string]map[string]bool{}
	for _, ks := range st {
		m := map[string]bool{}
		for _, k := range ks.Keys {
			m[k.ID] = true
		}
		out[ks.Name] = m
	}
	return out, "the daemon's hot set (/debug/hotkeys)"
}

// daemonStatus reads the daemon's /debug/hotkeys in full; nil when it does not answer within timeout.
func daemonStatus(addr string, timeout time.Duration) []warmer.KeyspaceStatus {
	if addr == "" {
		return nil
	}
	c := http.Client{Timeout: timeout}
	resp, err := c.Get("http://" + addr + "/debug/hotkeys?limit=0")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var st []warmer.KeyspaceStatus
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&st) != nil {
		return nil
	}
	return st
}

func names(spaces []*loadSpace) string {
	var s []string
	for _, ls := range spaces {
		s = append(s, fmt.Sprintf("%s (%d ids)", ls.name, len(ls.ids)))
	}
	return strings.Join(s, ", ")
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	i := int(p * float64(len(d)-1))
	return d[i]
}

func report(w io.Writer, spaces []*loadSpace, elapsed time.Duration, f loadFlags, hotSource string) {
	fmt.Fprintf(w, "load: %d workers for %v, zipf s=%v, warm-up %v\n\n", f.workers, elapsed.Round(time.Second), f.zipf, f.warmup)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "keyspace\treads\thits\tmisses\tstale\tapp rebuilds\terrors\tp50\tp99\tmax\thot ids\thot reads*\thot misses*\thot-when-read reads†\thot-when-read misses†\t")
	for _, ls := range spaces {
		ls.mu.Lock()
		slices.Sort(ls.latencies)
		var hr, hm int
		for id := range ls.hot {
			if s := ls.perID[id]; s != nil {
				hr += s.reads
				hm += s.misses
			}
		}
		live, liveMiss := "-", "-"
		if ls.liveHotReads > 0 {
			live, liveMiss = strconv.Itoa(ls.liveHotReads), strconv.Itoa(ls.liveHotMisses)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%v\t%v\t%v\t%d\t%d\t%d\t%s\t%s\t\n", ls.name, ls.reads, ls.hits, ls.misses,
			ls.stale, ls.appRebuilds.Load(), ls.errs, round(pct(ls.latencies, .5)), round(pct(ls.latencies, .99)),
			round(pct(ls.latencies, 1)), len(ls.hot), hr, hm, live, liveMiss)
		ls.mu.Unlock()
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\n* after the %v warm-up; hot ids are pinned ids plus %s at the end of the run\n", f.warmup, hotSource)
	fmt.Fprintf(w, "† after the %v warm-up; reads of ids the daemon held hot at the moment of the read (/debug/hotkeys, re-read every second)\n", f.warmup)
	for _, ls := range spaces {
		if ls.firstErr != nil {
			fmt.Fprintf(w, "%s: first error: %v\n", ls.name, ls.firstErr)
		}
	}
}

func round(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return strconv.FormatFloat(float64(d)/1e3, 'f', 0, 64) + "µs"
	case d < time.Second:
		return strconv.FormatFloat(float64(d)/1e6, 'f', 1, 64) + "ms"
	}
	return d.Round(10 * time.Millisecond).String()
}
