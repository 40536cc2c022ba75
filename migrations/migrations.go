// Package migrations holds keepwarm's SQL migrations (goose v3 format, *.sql in this directory, embedded) and
// applies them with goose's Provider API. Everything lives in the "keepwarm" schema, including goose's version
// table (keepwarm.goose_db_version); each migration runs in its own transaction, and a PostgreSQL advisory lock
// keeps two keepwarm processes from migrating at once. `keepwarm migrate up|down|status` calls these.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io"
	"path"
	"text/tabwriter"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// FS holds the migrations.
//
//go:embed *.sql
var FS embed.FS

// Schema is the PostgreSQL schema of keepwarm's tables.
const Schema = "keepwarm"

// VersionTable is goose's version table.
const VersionTable = Schema + ".goose_db_version"

// NewProvider returns a goose provider for db. It first creates the keepwarm schema if needed, since goose
// creates its version table there before running any migration.
func NewProvider(ctx context.Context, db *sql.DB) (*goose.Provider, error) {
	if err := createSchema(ctx, db); err != nil {
		return nil, fmt.Errorf("migrations: create schema %s: %w", Schema, err)
	}
	return newProvider(db)
}

// newProvider returns a goose provider for db without touching the database.
func newProvider(db *sql.DB) (*goose.Provider, error) {
	// goose polls for its lock; once a second (for up to 5 minutes) rather than its default 5 s.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, FS,
		goose.WithTableName(VersionTable),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return p, nil
}

// Up applies every pending migration and reports each one on out ("OK    up 00001_warmup_runs.sql (12ms)").
func Up(ctx context.Context, db *sql.DB, out io.Writer) error {
	p, err := NewProvider(ctx, db)
	if err != nil {
		return err
	}
	results, err := p.Up(ctx)
	for _, r := range results {
		fmt.Fprintln(out, r)
	}
	if err != nil {
		return fmt.Errorf("migrations: up: %w", err)
	}
	v, err := p.GetDBVersion(ctx)
	if err != nil {
		return fmt.Errorf("migrations: version: %w", err)
	}
	if len(results) == 0 {
		fmt.Fprintf(out, "up to date at version %d\n", v)
	} else {
		fmt.Fprintf(out, "now at version %d\n", v)
	}
	return nil
}

// Down rolls back the latest applied migration and reports it on out.
func Down(ctx context.Context, db *sql.DB, out io.Writer) error {
	p, err := NewProvider(ctx, db)
	if err != nil {
		return err
	}
	r, err := p.Down(ctx)
	if errors.Is(err, goose.ErrNoNextVersion) {
		fmt.Fprintln(out, "nothing to roll back: at version 0")
		return nil
	}
	if r != nil {
		fmt.Fprintln(out, r)
	}
	if err != nil {
		return fmt.Errorf("migrations: down: %w", err)
	}
	v, err := p.GetDBVersion(ctx)
	if err != nil {
		return fmt.Errorf("migrations: version: %w", err)
	}
	fmt.Fprintf(out, "now at version %d\n", v)
	return nil
}

// Status writes one line per migration: its version, state (applied or pending), when it was applied and its
// file. It is read-only, so a read-only PostgreSQL role (or a hot standby) can run it: it creates neither the
// schema nor goose's version table, and shows every migration pending when the table does not exist yet.
func Status(ctx context.Context, db *sql.DB, out io.Writer) error {
	p, err := newProvider(db)
	if err != nil {
		return err
	}
	var exists bool
	if err := db.QueryRowContext(ctx, "select to_regclass($1) is not null", VersionTable).Scan(&exists); err != nil {
		return fmt.Errorf("migrations: status: look for %s: %w", VersionTable, err)
	}
	var statuses []*goose.MigrationStatus
	if exists {
		if statuses, err = p.Status(ctx); err != nil {
			return fmt.Errorf("migrations: status: %w", err)
		}
	} else {
		for _, src := range p.ListSources() {
			statuses = append(statuses, &goose.MigrationStatus{Source: src, State: goose.StatePending})
		}
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tSTATE\tAPPLIED AT\tFILE")
	for _, s := range statuses {
		at := "-"
		if !s.AppliedAt.IsZero() {
			at = s.AppliedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", s.Source.Version, s.State, at, path.Base(s.Source.Path))
	}
	return tw.Flush()
}

// schemaLock serialises "create schema if not exists", which can fail with a unique violation when two
// sessions run it at once.
const schemaLock int64 = 0x6b77_7363_6865 // "kwsche"

func createSchema(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, "select pg_advisory_xact_lock($1)", schemaLock); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "create schema if not exists "+Schema); err != nil {
		return err
	}
	return tx.Commit()
}
