package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/keepwarm/keepwarm/internal/assemble"
	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/internal/runs"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/warmer"
)

// failedShown is how many failed ids the summary prints; --failed-file gets them all (up to warmer.MaxFailedIDs).
const failedShown = 20

// cmdWarmup is `keepwarm warmup`: write a keyspace's keys now, ahead of a promotion, through the same lock,
// source and pipeline as the daemon. Exit 0 when every id was written, skipped for a lock, or missing at the
// origin (the missing policy applied); 1 on failures or interruption; 2 on usage or config errors.
func cmdWarmup(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("warmup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "config.toml", "config file (TOML)")
	keyspace := fs.String("keyspace", "", "keyspace to warm (required)")
	idsFlag := fs.String("ids", "", "comma-separated ids")
	idsFile := fs.String("ids-file", "", "file with one id per line ('-' for stdin)")
	list := fs.String("list", "", "name of a [[hotkeys]] list")
	query := fs.Bool("query", false, "use the keyspace's ids_query (streamed)")
	spread := fs.Duration("spread", 0, "spread the written TTLs uniformly over [ttl, ttl+spread) (e.g. 10m)")
	rateFlag := fs.Float64("rate", 0, "at most this many ids per second (never above the keyspace's origin budget)")
	dryRun := fs.Bool("dry-run", false, "query and write nothing: print the ids, batches and projected TTLs")
	name := fs.String("name", "cli", "name of the run in keepwarm.warmup_runs")
	failedFile := fs.String("failed-file", "", "write the failed ids here, one per line")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("warmup: unexpected arguments %q", fs.Args())
	}
	sources := 0
	for _, set := range []bool{*idsFlag != "", *idsFile != "", *list != "", *query} {
		if set {
			sources++
		}
	}
	switch {
	case *keyspace == "":
		return usagef("warmup: --keyspace is required")
	case sources != 1:
		return usagef("warmup: give exactly one of --ids, --ids-file, --list, --query")
	case *spread < 0 || *rateFlag < 0:
		return usagef("warmup: --spread and --rate must not be negative")
	case *spread > warmer.MaxDuration:
		return usagef("warmup: --spread %v is above the limit of %v (one year)", *spread, warmer.MaxDuration)
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return &usageError{msg: err.Error()}
	}
	ks := cfg.Keyspace(*keyspace)
	if ks == nil {
		return usagef("warmup: keyspace %q is not in %s", *keyspace, *path)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	rdb, err := assemble.Redis(ctx, cfg, connectTimeout)
	if err != nil {
		return err
	}
	defer rdb.Close()
	pool, err := assemble.Postgres(ctx, cfg, connectTimeout)
	if err != nil {
		return err
	}
	defer pool.Close()
	srcs, err := assemble.Sources(pool, cfg)
	if err != nil {
		return err
	}
	src := srcs[ks.Name]

	var ids warmer.IDSource
	total := -1 // unknown: streamed
	switch {
	case *idsFlag != "":
		list := splitIDs(*idsFlag)
		ids, total = warmer.SliceIDs(list), len(list)
	case *list != "":
		h := cfg.HotkeysList(*list)
		if h == nil {
			return usagef("warmup: no [[hotkeys]] list named %q", *list)
		}
		if h.Keyspace != ks.Name {
			return usagef("warmup: list %q belongs to keyspace %q, not %q", *list, h.Keyspace, ks.Name)
		}
		ids, total = warmer.SliceIDs(h.IDs), len(h.IDs)
		if len(h.Skipped) > 0 {
			log.Warn("warmup: skipping lines of the list that are not valid ids (keepwarm validate lists them all)",
				"list", h.Name, "skipped", len(h.Skipped), "first", h.Skipped[0])
		}
	case *idsFile != "":
		ids = fileIDs(*idsFile)
	case *query:
		if ks.IDsQuery == "" {
			return usagef("warmup: keyspace %q has no ids_query", ks.Name)
		}
		ids = src.IDs
	}

	w, err := warmer.New(rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{assemble.Keyspace(cfg, ks, src)}, Logger: log})
	if err != nil {
		return err
	}
	var rec *runs.Recorder
	runID := int64(0)
	if !*dryRun {
		rec = runs.New(pool, "")
		if runID, err = rec.Start(ctx, *name, warmer.TriggerCLI, ks.Name); err != nil {
			fmt.Fprintf(stderr, "keepwarm: warning: %v; the warmup goes on unrecorded\n", err)
			rec = nil
		}
	}
	progress, finishProgress := newProgress(stderr, total)
	res, err := w.Warmup(ctx, ks.Name, ids, warmer.WarmupOptions{Spread: *spread, Rate: *rateFlag, DryRun: *dryRun,
		Progress: progress})
	finishProgress()
	if rec != nil {
		if ferr := rec.Finish(ctx, runID, res, err); ferr != nil {
			fmt.Fprintf(stderr, "keepwarm: warning: %v\n", ferr)
		}
	}
	printWarmup(stdout, ks, res, *dryRun, runID)
	if *failedFile != "" && len(res.FailedIDs) > 0 {
		if werr := os.WriteFile(*failedFile, []byte(strings.Join(res.FailedIDs, "\n")+"\n"), 0o644); werr != nil {
			fmt.Fprintf(stderr, "keepwarm: warning: write --failed-file: %v\n", werr)
		}
	}
	switch {
	case err != nil:
		return err
	case res.Interrupted:
		return errors.New("warmup interrupted")
	case res.Failed > 0:
		return fmt.Errorf("warmup: %d ids failed (first error: %v)", res.Failed, res.FirstError)
	}
	return nil
}

func splitIDs(s string) []string {
	var out []string
	for _, id := range strings.Split(s, ",") {
		if id = strings.TrimSpace(id); id != "" {
			out = append(out, id)
		}
	}
	return out
}

// fileIDs streams ids from a file (or stdin for "-"), one per line; blank lines and # comments are skipped.
func fileIDs(path string) warmer.IDSource {
	return func(ctx context.Context, emit func(string) error) error {
		r := io.Reader(os.Stdin)
		if path != "-" {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			r = f
		}
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64*1024), lockstep.MaxIDBytes+2)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if err := emit(line); err != nil {
				return err
			}
		}
		return sc.Err()
	}
}

// newProgress shows a progress bar with keys/s and ETA on a terminal, or logs a line every 5 s otherwise.
func newProgress(stderr io.Writer, total int) (func(warmer.WarmupResult), func()) {
	f, isFile := stderr.(*os.File)
	if isFile && term.IsTerminal(int(f.Fd())) {
		bar := progressbar.NewOptions64(int64(total), progressbar.OptionSetWriter(stderr),
			progressbar.OptionSetDescription("warming"), progressbar.OptionShowCount(), progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("keys"), progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionSetPredictTime(true), progressbar.OptionFullWidth())
		return func(r warmer.WarmupResult) {
				_ = bar.Set64(r.Written + r.SkippedLocked + r.Missing + r.Failed)
			}, func() {
				_ = bar.Finish()
				fmt.Fprintln(stderr)
			}
	}
	start := time.Now()
	last := start
	return func(r warmer.WarmupResult) {
		if time.Since(last) < 5*time.Second {
			return
		}
		last = time.Now()
		done := r.Written + r.SkippedLocked + r.Missing + r.Failed
		fmt.Fprintf(stderr, "warmup: %d done (%d written, %d locked, %d missing, %d failed), %.0f keys/s\n",
			done, r.Written, r.SkippedLocked, r.Missing, r.Failed, float64(done)/time.Since(start).Seconds())
	}, func() {}
}

func printWarmup(w io.Writer, ks *config.Keyspace, r warmer.WarmupResult, dryRun bool, runID int64) {
	verb := "warmup"
	if dryRun {
		verb = "dry run (nothing queried or written)"
	}
	state := "done"
	if r.Interrupted {
		state = "INTERRUPTED"
	}
	fmt.Fprintf(w, "%s of keyspace %s: %s", verb, ks.Name, state)
	if runID > 0 {
		fmt.Fprintf(w, " (keepwarm.warmup_runs id %d)", runID)
	}
	fmt.Fprintln(w)
	if dryRun {
		fmt.Fprintf(w, "  ids %d in %d batches of up to %d\n", r.Requested, r.Batches, ks.BatchSize)
		fmt.Fprintln(w, "  projected TTLs:")
	} else {
		rate := float64(r.Written+r.SkippedLocked+r.Missing+r.Failed) / max(r.Duration.Seconds(), 1e-9)
		fmt.Fprintf(w, "  requested %d  written %d  skipped (locked) %d  missing %d  failed %d",
			r.Requested, r.Written, r.SkippedLocked, r.Missing, r.Failed)
		if r.NotKept > 0 {
			fmt.Fprintf(w, " (of which not kept: %d written, then evicted at once: Redis is at maxmemory)", r.NotKept)
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "  duration %v  %.0f keys/s  batches %d\n", r.Duration.Round(time.Millisecond), rate, r.Batches)
		fmt.Fprintln(w, "  written TTLs (the new expiries, relative to the write):")
	}
	printHistogram(w, r.TTLs)
	if len(r.FailedIDs) > 0 {
		shown := r.FailedIDs[:min(len(r.FailedIDs), failedShown)]
		fmt.Fprintf(w, "  failed ids (%d of %d): %s\n", len(shown), r.Failed, strings.Join(shown, ", "))
		fmt.Fprintf(w, "  first error: %v\n", r.FirstError)
	}
}

func printHistogram(w io.Writer, h warmer.Histogram) {
	var peak int64
	for _, c := range h.Counts {
		peak = max(peak, c)
	}
	if peak == 0 {
		fmt.Fprintln(w, "    (none)")
		return
	}
	width := time.Duration(int64(h.Max-h.Min) / int64(len(h.Counts)))
	for i, c := range h.Counts {
		lo := h.Min + time.Duration(i)*width
		bar := strings.Repeat("#", int(40*c/peak))
		fmt.Fprintf(w, "    %9s .. %-9s |%-40s %d\n", round(lo), round(lo+width), bar, c)
	}
}

func round(d time.Duration) string {
	switch {
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}
