package main

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keepwarm/keepwarm/internal/assemble"
	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/sources/postgres/stream"
)

// migrateChanges is the change stream's part of `keepwarm migrate up`: it checks the fed_by tables and columns
// against the catalog, creates the publication (or adds missing tables to it), and with identityFull sets
// REPLICA IDENTITY FULL on the tables whose id columns are not in their replica identity (otherwise it prints
// the statement). It does nothing unless the change stream is on ([changes] enabled and some keyspace fed).
func migrateChanges(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool, identityFull bool, stdout io.Writer) error {
	if !cfg.Streamed() {
		return nil
	}
	warnings, err := stream.CheckFeeds(ctx, pool, assemble.FeedColumns(cfg))
	if err != nil {
		return fmt.Errorf("changes: %w", err)
	}
	if err := stream.EnsurePublication(ctx, cfg.StreamDSN(), cfg.Changes.Publication, cfg.FeedingTables()); err != nil {
		return fmt.Errorf("changes: %w", err)
	}
	fmt.Fprintf(stdout, "changes: publication %s covers %v\n", cfg.Changes.Publication, cfg.FeedingTables())
	if len(warnings) == 0 {
		return nil
	}
	if !identityFull {
		for _, w := range warnings {
			fmt.Fprintln(stdout, "changes: warning: "+w.String())
		}
		return nil
	}
	var done []string
	for _, w := range warnings {
		if slices.Contains(done, w.Table) {
			continue
		}
		done = append(done, w.Table)
		schema, name, _ := stream.SplitTable(w.Table)
		q := "alter table " + pgx.Identifier{schema, name}.Sanitize() + " replica identity full"
		if _, err := pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("changes: %s: %w", q, err)
		}
		fmt.Fprintf(stdout, "changes: %s (so that an UPDATE of %s sends the old id too)\n", q, w.Column)
	}
	return nil
}
