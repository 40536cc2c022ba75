// Command load puts the Chinook demo catalog into PostgreSQL (see package chinook); `make demo-data` runs it.
//
//	go run ./examples/chinook/load [-dsn postgres://keepwarm@127.0.0.1:15432/chinook?sslmode=disable]
//
// It creates the database when missing, loads the catalog in one transaction, and does nothing when the
// catalog is already there.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"

	"github.com/keepwarm/keepwarm/examples/chinook"
)

func main() {
	dsn := flag.String("dsn", envOr("KEEPWARM_CHINOOK_DSN", chinook.DefaultDSN), "connection string naming the database to load into (env KEEPWARM_CHINOOK_DSN)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := pgx.ParseConfig(*dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chinook: parse -dsn:", err)
		os.Exit(2)
	}
	loaded, err := chinook.Load(ctx, *dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if loaded {
		fmt.Printf("chinook: loaded %d tracks into database %q\n", chinook.Tracks, cfg.Database)
	} else {
		fmt.Printf("chinook: already loaded in database %q; nothing to do\n", cfg.Database)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
