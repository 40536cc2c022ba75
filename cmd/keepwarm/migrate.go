package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/migrations"
	"github.com/keepwarm/keepwarm/sources/postgres"
)

// cmdMigrate is `keepwarm migrate up|down|status`: keepwarm's own tables (schema keepwarm) in the database of
// [postgres] dsn. up applies every pending migration, down rolls back the latest one, status lists them.
func cmdMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "config.toml", "config file (TOML); its [postgres] dsn names the database")
	identityFull := fs.Bool("replica-identity-full", false,
		"up: also set REPLICA IDENTITY FULL on fed_by tables whose id column is not in their replica identity")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: keepwarm migrate up|down|status [--config config.toml]")
		fs.PrintDefaults()
	}
	// Accept the verb before or after the flags.
	verb := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		verb, args = args[0], args[1:]
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	rest := fs.Args()
	if verb == "" && len(rest) > 0 {
		verb, rest = rest[0], rest[1:]
	}
	if len(rest) > 0 {
		return usagef("migrate: unexpected argument %q", rest[0])
	}
	var apply func(context.Context, *sql.DB, io.Writer) error
	switch verb {
	case "up":
		apply = migrations.Up
	case "down":
		apply = migrations.Down
	case "status":
		apply = migrations.Status
	case "":
		return usagef("migrate: say up, down or status")
	default:
		return usagef("migrate: unknown action %q: want up, down or status", verb)
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	pool, err := postgres.NewPool(ctx, cfg.Postgres.DSN, 2, cfg.Postgres.ConnectTimeout)
	if err != nil {
		return err
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := apply(ctx, db, stdout); err != nil {
		return fmt.Errorf("postgres %s: %w", cfg.Postgres.RedactedDSN(), err)
	}
	if verb == "up" {
		return migrateChanges(ctx, cfg, pool, *identityFull, stdout)
	}
	return nil
}
