package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/keepwarm/keepwarm/internal/assemble"
	"github.com/keepwarm/keepwarm/internal/benchload"
	"github.com/keepwarm/keepwarm/internal/config"
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
	var spaces []*benchload.Space
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
		ls, err := benchload.NewSpace(ctx, ks, srcs[ks.Name], f.seed)
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
	readers := benchload.Readers{Workers: f.workers, Zipf: f.zipf, Sample: f.sample, Seed: f.seed}
	clients, setupErr := benchload.StartReaders(rctx, &wg, rdb, spaces, readers, warmEnd, func(ks, id string) bool {
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
	hotAtEnd := map[string]map[string]bool{} // keyspace → the ids hot at the end of the run
	for _, ls := range spaces {
		h, ok := hot[ls.Name]
		if !ok {
			h = ls.TopRead(ls.Keyspace.TopN)
			source = "top_n most-read ids of this run (daemon not reachable)"
		}
		for _, id := range cfg.Pinned(ls.Name) {
			h[id] = true
		}
		hotAtEnd[ls.Name] = h
	}
	report(stdout, spaces, hotAtEnd, elapsed, f, source)
	sampler.report(stdout, spaces)
	return nil
}

// daemonHot asks the daemon for its hot set: keyspace → id → true.
func daemonHot(addr string) (map[string]map[string]bool, string) {
	st := benchload.DaemonStatus(addr, 3*time.Second)
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

func names(spaces []*benchload.Space) string {
	var s []string
	for _, ls := range spaces {
		s = append(s, fmt.Sprintf("%s (%d ids)", ls.Name, len(ls.IDs)))
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

// report prints one row per keyspace; hot holds the ids counted as hot at the end of the run, by keyspace.
func report(w io.Writer, spaces []*benchload.Space, hot map[string]map[string]bool, elapsed time.Duration, f loadFlags, hotSource string) {
	fmt.Fprintf(w, "load: %d workers for %v, zipf s=%v, warm-up %v\n\n", f.workers, elapsed.Round(time.Second), f.zipf, f.warmup)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "keyspace\treads\thits\tmisses\tstale\tapp rebuilds\terrors\tp50\tp99\tmax\thot ids\thot reads*\thot misses*\thot-when-read reads†\thot-when-read misses†\t")
	stats := make([]benchload.Stats, len(spaces))
	for i, ls := range spaces {
		st := ls.Stats()
		stats[i] = st
		var hr, hm int
		for id := range hot[ls.Name] {
			if s, ok := st.PerID[id]; ok {
				hr += s.Reads
				hm += s.Misses
			}
		}
		live, liveMiss := "-", "-"
		if st.LiveHotReads > 0 {
			live, liveMiss = strconv.Itoa(st.LiveHotReads), strconv.Itoa(st.LiveHotMisses)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%v\t%v\t%v\t%d\t%d\t%d\t%s\t%s\t\n", ls.Name, st.Reads, st.Hits, st.Misses,
			st.Stale, st.AppRebuilds, st.Errors, round(pct(st.Latencies, .5)), round(pct(st.Latencies, .99)),
			round(pct(st.Latencies, 1)), len(hot[ls.Name]), hr, hm, live, liveMiss)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\n* after the %v warm-up; hot ids are pinned ids plus %s at the end of the run\n", f.warmup, hotSource)
	fmt.Fprintf(w, "† after the %v warm-up; reads of ids the daemon held hot at the moment of the read (/debug/hotkeys, re-read every second)\n", f.warmup)
	for i, ls := range spaces {
		if stats[i].FirstErr != nil {
			fmt.Fprintf(w, "%s: first error: %v\n", ls.Name, stats[i].FirstErr)
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
