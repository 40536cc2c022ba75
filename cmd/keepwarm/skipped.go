package main

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keepwarm/keepwarm/internal/config"
)

// skippedShown bounds the bad lines named in run's one warning; validate lists them all.
const skippedShown = 5

// skippedIDs reports the lines of hot-key list files that loading the config skipped because they are not valid
// ids (config.Hotkeys.Skipped): `run` logs one warning per load and counts them, and warms the other ids.
type skippedIDs struct {
	log   *slog.Logger
	total *prometheus.CounterVec // keyspace
}

func newSkippedIDs(reg prometheus.Registerer, log *slog.Logger) *skippedIDs {
	s := &skippedIDs{log: log, total: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "keepwarm_config_skipped_ids_total",
		Help: "Lines of hot-key list files skipped because they are not valid ids, by keyspace; counted at each " +
			"config load (start and every applied reload). `keepwarm validate` lists them with their line numbers.",
	}, []string{"keyspace"})}
	reg.MustRegister(s.total)
	return s
}

// report logs one warning for all of cfg's skipped lines, naming the first few, and counts them.
func (s *skippedIDs) report(cfg *config.Config) {
	var lines []string
	var lists []string
	for _, h := range cfg.Hotkeys {
		if len(h.Skipped) == 0 {
			continue
		}
		s.total.WithLabelValues(h.Keyspace).Add(float64(len(h.Skipped)))
		lists = append(lists, fmt.Sprintf("%s (%d of %d lines)", h.Name, len(h.Skipped), len(h.Skipped)+len(h.IDs)))
		lines = append(lines, h.Skipped...)
	}
	if len(lines) == 0 {
		return
	}
	s.log.Warn("hot-key lists: skipped lines that are not valid ids; the other ids are warmed "+
		"(keepwarm validate lists every bad line)",
		"skipped", len(lines), "lists", lists, "first", lines[:min(len(lines), skippedShown)])
}

// printSkipped lists every skipped line of cfg's hot-key list files, for `keepwarm validate`.
func printSkipped(w io.Writer, cfg *config.Config) {
	for _, h := range cfg.Hotkeys {
		if len(h.Skipped) == 0 {
			continue
		}
		fmt.Fprintf(w, "warning: hotkeys %q: %d lines are not valid ids; run skips them and warms the other %d:\n",
			h.Name, len(h.Skipped), len(h.IDs))
		for _, l := range h.Skipped {
			fmt.Fprintf(w, "  %s\n", l)
		}
	}
}
