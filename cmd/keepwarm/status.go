package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/warmer"
)

// cmdStatus is `keepwarm status`: the running daemon's hot keys as a table, from /debug/hotkeys.
func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "config file: read the daemon's listen address from it")
	addr := fs.String("addr", "", "the daemon's HTTP address (default: from --config, else "+config.DefaultListen+")")
	limit := fs.Int("limit", 20, "hot keys shown per keyspace (0: all)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	target := *addr
	if target == "" && *path != "" {
		cfg, err := config.Load(*path)
		if err != nil {
			return err
		}
		target = cfg.Daemon.Listen
	}
	if target == "" {
		target = config.DefaultListen
	}
	var spaces []warmer.KeyspaceStatus
	if err := getJSON(ctx, fmt.Sprintf("http://%s/debug/hotkeys?limit=%d", target, *limit), &spaces); err != nil {
		return err
	}
	var scheds []warmer.ScheduleStatus
	if err := getJSON(ctx, fmt.Sprintf("http://%s/debug/schedules", target), &scheds); err != nil {
		return err
	}
	var stream streamStatus
	if err := getJSON(ctx, fmt.Sprintf("http://%s/debug/stream", target), &stream); err != nil {
		return err
	}
	var fleet warmer.FleetStatus
	fleetErr := getJSON(ctx, fmt.Sprintf("http://%s/debug/fleet", target), &fleet) // a daemon before /debug/fleet: 404
	var health healthStatus
	if err := getJSON(ctx, fmt.Sprintf("http://%s/debug/health", target), &health); err == nil { // 404 before it
		printHealth(stdout, health)
	}
	now := time.Now()
	if fleetErr == nil {
		printFleet(stdout, fleet)
	}
	printStatus(stdout, spaces, now)
	printSchedules(stdout, scheds, now)
	printStream(stdout, stream)
	return nil
}

func getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("status: is the daemon running? %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status: %s answered %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("status: decode %s: %w", url, err)
	}
	return nil
}

func printSchedules(w io.Writer, scheds []warmer.ScheduleStatus, now time.Time) {
	if len(scheds) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCHEDULE\tKEYSPACE\tCRON\tNEXT RUN\tLAST RUN")
	for _, s := range scheds {
		last := "never (on this daemon)"
		if !s.Last.IsZero() {
			last = s.Last.Format(time.RFC3339) + " " + s.LastResult
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s (in %s)\t%s\n", s.Name, s.Keyspace, s.Spec, s.Next.Format(time.RFC3339),
			s.Next.Sub(now).Round(time.Second), last)
	}
	_ = tw.Flush()
}

func printStatus(w io.Writer, spaces []warmer.KeyspaceStatus, now time.Time) {
	for i, ks := range spaces {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "keyspace %s (%s): %d tracked, %d hot (%d owned by this replica), %d due now\n", ks.Name, ks.KeyTemplate,
			ks.Tracked, ks.Hot, ks.Owned, ks.Due)
		if len(ks.Keys) == 0 {
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  KEY\tTTL\tNEXT REFRESH\tSCORE\tLAST REBUILD\tNOTE")
		for _, k := range ks.Keys {
			ttl, next := "-", "-"
			if k.TTL > 0 {
				ttl = k.TTL.Round(100 * time.Millisecond).String()
			}
			switch {
			case k.Refreshing:
				next = "refreshing now"
			case !k.NextRefresh.IsZero():
				next = "in " + max(k.NextRefresh.Sub(now), 0).Round(100*time.Millisecond).String()
			}
			note := ""
			switch {
			case k.Persistent:
				note = "no TTL: left alone"
			case k.Missing:
				note = "missing at origin"
			case k.LastError != "":
				note = "error: " + k.LastError
			case k.Pinned:
				note = "pinned"
			}
			fmt.Fprintf(tw, "  %q\t%s\t%s\t%.1f\t%s\t%s\n", k.Key, ttl, next, k.Score,
				k.LastRebuild.Round(time.Millisecond), note)
		}
		_ = tw.Flush()
	}
}

// printFleet prints the replica's view of its fleet: who is in it, and whose heartbeat is late.
func printFleet(w io.Writer, f warmer.FleetStatus) {
	if !f.Enabled {
		fmt.Fprintf(w, "fleet: off (this replica refreshes every hot key)\n\n")
		return
	}
	members := "members"
	if len(f.Members) == 1 {
		members = "member"
	}
	fmt.Fprintf(w, "fleet %s: %d %s, heartbeat every %v, TTL %v", f.Key, len(f.Members), members, f.HeartbeatInterval, f.HeartbeatTTL)
	if f.LastError != "" {
		fmt.Fprintf(w, "; last heartbeat failed: %s", f.LastError)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  REPLICA\tHEARTBEAT EXPIRES IN\tSTATE")
	for _, m := range f.Members {
		state := "live"
		if m.Late {
			state = "late: its keys are covered by the others"
		}
		if m.Self {
			state += " (this replica)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", m.ID, m.ExpiresIn.Round(time.Millisecond), state)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
}
