package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/keepwarm/keepwarm/internal/assemble"
	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/sources/postgres"
	"github.com/keepwarm/keepwarm/sources/postgres/stream"
)

// cmdValidate is `keepwarm validate`: load the config (with the environment's overrides), print "ok" and one
// line per keyspace, or every problem and exit 1. With --check-db it also prepares every keyspace's queries on
// PostgreSQL, which catches SQL errors without running anything; --check does that and also connects to Redis
// with the configured credentials (PING), so a wrong Redis password or a missing ACL permission fails too. It
// never prints a secret.
func cmdValidate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "config.toml", "config file (TOML)")
	checkDB := fs.Bool("check-db", false, "also connect to PostgreSQL and prepare (not run) every keyspace's queries")
	check := fs.Bool("check", false, "--check-db, and also connect to Redis with the configured credentials")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: keepwarm validate [--config config.toml] [--check-db | --check]")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("validate: unexpected argument %q", fs.Arg(0))
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	var errs []error
	if *check {
		if err := checkRedis(ctx, cfg); err != nil {
			errs = append(errs, err)
		}
	}
	if *checkDB || *check {
		if err := checkQueries(ctx, cfg); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	summarize(stdout, *path, cfg, *checkDB || *check)
	printSkipped(stdout, cfg)
	if *check {
		fmt.Fprintln(stdout, "redis: answered PING with the configured credentials")
	}
	return nil
}

func summarize(w io.Writer, path string, cfg *config.Config, checkedDB bool) {
	fmt.Fprintf(w, "ok: %s: %s, %s, %s", path,
		plural(len(cfg.Keyspaces), "keyspace"), plural(len(cfg.Hotkeys), "hotkeys list"), plural(len(cfg.Schedules), "schedule"))
	if checkedDB {
		fmt.Fprint(w, "; queries prepared on PostgreSQL")
	}
	fmt.Fprintln(w)
	for _, n := range cfg.Notes {
		fmt.Fprintln(w, "note: "+n)
	}
	// The values shown are the effective ones that run uses: Load filled in the derived defaults with warmer's
	// Resolve, the function warmer.New runs. The keyspace columns are config.KeyspaceFields' with a Column.
	var cols []config.KeyspaceField
	for _, f := range config.KeyspaceFields() {
		if f.Column != "" {
			cols = append(cols, f)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, f := range cols {
		fmt.Fprint(tw, f.Column+"\t")
	}
	fmt.Fprintln(tw, "PINNED\tSCHEDULES")
	for _, ks := range cfg.Keyspaces {
		for _, f := range cols {
			fmt.Fprint(tw, f.Cell(ks)+"\t")
		}
		var scheds []string
		for _, s := range cfg.SchedulesFor(ks.Name) {
			scheds = append(scheds, s.Name)
		}
		if len(scheds) == 0 {
			scheds = []string{"-"}
		}
		fmt.Fprintf(tw, "%d\t%s\n", len(cfg.Pinned(ks.Name)), strings.Join(scheds, ","))
	}
	_ = tw.Flush()
	summarizeChanges(w, cfg, checkedDB)
}

// summarizeChanges prints the change stream's settings and, per fed keyspace, what feeds it.
func summarizeChanges(w io.Writer, cfg *config.Config, checkedDB bool) {
	if len(cfg.FeedingTables()) == 0 {
		return
	}
	state := "off ([changes] enabled = false)"
	if cfg.Changes.Enabled {
		state = fmt.Sprintf("on: slot %s, publication %s, dsn %s", cfg.Changes.Slot, cfg.Changes.Publication,
			redactedStreamDSN(cfg))
	}
	fmt.Fprintln(w, "changes: "+state)
	for _, ks := range cfg.Keyspaces {
		if len(ks.FedBy) > 0 {
			fmt.Fprintf(w, "  %s <- %s\n", ks.Name, ks.FeedsString())
		}
	}
	if !checkedDB {
		fmt.Fprintln(w, "  (fed_by tables and columns not checked against the catalog: use --check-db)")
	}
}

func redactedStreamDSN(cfg *config.Config) string {
	if cfg.Changes.DSN != "" {
		return cfg.Changes.RedactedDSN()
	}
	return cfg.Postgres.RedactedDSN() + " ([postgres] dsn)"
}

// checkRedis connects to Redis as the daemon does and PINGs it within the connect timeout. A permission or
// authentication error is named as such.
func checkRedis(ctx context.Context, cfg *config.Config) error {
	rdb, err := assemble.Redis(ctx, cfg, connectTimeout)
	if err != nil {
		if perm := assemble.Permission(err); perm != "" {
			return fmt.Errorf("%s: %w", perm, err)
		}
		return err
	}
	return rdb.Close()
}

// checkQueries prepares every keyspace's queries on PostgreSQL and reports all the failures together.
func checkQueries(ctx context.Context, cfg *config.Config) error {
	pool, err := postgres.NewPool(ctx, cfg.Postgres.DSN, 2, cfg.Postgres.ConnectTimeout)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("postgres %s: %w", cfg.Postgres.RedactedDSN(), err)
	}
	var errs []error
	// Behind a transaction-pooling PgBouncer, pgx's default statement cache fails at run time (SQLSTATE 42P05):
	// say so now, with what to set in the dsn.
	if err := postgres.CheckStatementCache(ctx, pool); err != nil {
		errs = append(errs, err)
	}
	// fed_by tables and columns must exist in the catalog (checked strictly); replica identity gaps are notes.
	if warnings, err := stream.CheckFeeds(ctx, pool, assemble.FeedColumns(cfg)); err != nil {
		errs = append(errs, err)
	} else {
		for _, w := range warnings {
			cfg.Notes = append(cfg.Notes, "changes: "+w.String())
		}
	}
	// What the change stream needs (wal_level, the publication and its tables, the slot's plugin), as run's
	// stream would find it.
	if cfg.Streamed() {
		sctx, cancel := context.WithTimeout(ctx, connectTimeout)
		err := stream.Check(sctx, assemble.StreamConfig(cfg))
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("changes: %w", err))
		}
	}
	for _, ks := range cfg.Keyspaces {
		src, err := postgres.New(pool, postgres.Config{Keyspace: ks.Name, Query: ks.Query, IDsQuery: ks.IDsQuery})
		if err == nil {
			err = src.Check(ctx)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("postgres %s: %w", cfg.Postgres.RedactedDSN(), errors.Join(errs...))
	}
	return nil
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
