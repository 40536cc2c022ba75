// Package chinook loads the Chinook demo catalog (version 1.4.5, MIT, by Luis Rocha) into PostgreSQL.
//
// The catalog lives in its own database, "chinook", on the local server; keepwarm's own schema ("keepwarm",
// created by `keepwarm migrate up`) goes into the same database, so the demo daemon needs one DSN:
//
//	postgres://keepwarm@127.0.0.1:15432/chinook?sslmode=disable
//
// The upstream script starts with DROP DATABASE / CREATE DATABASE / \c chinook. Load never runs those lines: it
// creates the database only when it is missing and runs the rest of the script (tables, keys, rows) in one
// transaction, so a half-loaded catalog cannot exist and loading again changes nothing. `make demo-data` and the
// tests use Load; a PostgreSQL advisory lock keeps parallel loaders (test packages run in parallel) from racing.
package chinook

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed Chinook_PostgreSql.sql
var script string

// Database is the name of the database the catalog is loaded into.
const Database = "chinook"

// Tracks is the number of rows in the catalog's track table; Load uses it to recognise a complete catalog.
const Tracks = 3503

// DefaultDSN is the demo database on the local PostgreSQL that scripts/services starts.
const DefaultDSN = "postgres://keepwarm@127.0.0.1:15432/chinook?sslmode=disable"

// lockKey is the pg_advisory_lock key that serialises loaders, taken in the "postgres" database.
const lockKey int64 = 0x6b77_6368_696e // "kwchin"

// headerEnd is the last line of the upstream script's database-level preamble, which Load skips.
const headerEnd = `\c chinook;`

// Body returns the part of the upstream script that Load runs: everything after the preamble that drops and
// creates the database. It fails if the embedded script does not have the expected shape.
func Body() (string, error) {
	i := strings.Index(script, headerEnd)
	if i < 0 {
		return "", fmt.Errorf("chinook: script has no %q line; was it replaced by another version?", headerEnd)
	}
	body := script[i+len(headerEnd):]
	for n, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), `\`) {
			return "", fmt.Errorf("chinook: script has a psql meta-command after the preamble (line %d of the body): %q", n+1, line)
		}
	}
	return body, nil
}

// Load makes sure the database named by dsn holds the complete catalog. It connects to the same server's
// "postgres" database to take an advisory lock and, when missing, create the target database, then loads the
// script in one transaction. It returns loaded=false when the catalog was already there. It refuses to touch a
// database whose track table exists with another row count.
func Load(ctx context.Context, dsn string) (loaded bool, err error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return false, fmt.Errorf("chinook: parse dsn: %w", err)
	}
	target := cfg.Database
	if target == "" || target == "postgres" {
		return false, fmt.Errorf("chinook: the dsn must name the database to load into (e.g. %q), not %q", Database, target)
	}
	admin := cfg.Copy()
	admin.Database = "postgres"
	ac, err := pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return false, fmt.Errorf("chinook: connect to the postgres database: %w", err)
	}
	defer ac.Close(context.WithoutCancel(ctx))
	if _, err := ac.Exec(ctx, "select pg_advisory_lock($1)", lockKey); err != nil {
		return false, fmt.Errorf("chinook: take the loader lock: %w", err)
	}
	defer func() {
		_, uerr := ac.Exec(context.WithoutCancel(ctx), "select pg_advisory_unlock($1)", lockKey)
		if err == nil && uerr != nil {
			err = fmt.Errorf("chinook: release the loader lock: %w", uerr)
		}
	}()

	var exists bool
	if err := ac.QueryRow(ctx, "select exists(select 1 from pg_database where datname = $1)", target).Scan(&exists); err != nil {
		return false, fmt.Errorf("chinook: look for database %q: %w", target, err)
	}
	if !exists {
		if _, err := ac.Exec(ctx, "create database "+pgx.Identifier{target}.Sanitize()); err != nil {
			return false, fmt.Errorf("chinook: create database %q: %w", target, err)
		}
	}

	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return false, fmt.Errorf("chinook: connect to database %q: %w", target, err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	var hasTrack bool
	if err := c.QueryRow(ctx, "select to_regclass('public.track') is not null").Scan(&hasTrack); err != nil {
		return false, fmt.Errorf("chinook: look for the track table: %w", err)
	}
	if hasTrack {
		var n int
		if err := c.QueryRow(ctx, "select count(*) from public.track").Scan(&n); err != nil {
			return false, fmt.Errorf("chinook: count tracks: %w", err)
		}
		if n != Tracks {
			return false, fmt.Errorf("chinook: database %q has a track table with %d rows, not %d: not touching it", target, n, Tracks)
		}
		return false, nil
	}

	body, err := Body()
	if err != nil {
		return false, err
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("chinook: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, body); err != nil {
		return false, fmt.Errorf("chinook: load script: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("chinook: commit: %w", err)
	}
	return true, nil
}

// DSNFor returns dsn with its database replaced by Database, for URL ("postgres://...") and keyword/value
// ("host=... dbname=...") connection strings alike.
func DSNFor(dsn string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", errors.New("chinook: dsn is not a valid URL")
		}
		u.Path = "/" + Database
		u.RawPath = ""
		return u.String(), nil
	}
	return strings.TrimSpace(dsn) + " dbname=" + Database, nil
}
