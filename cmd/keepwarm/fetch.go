package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/sources/postgres"
	"github.com/keepwarm/keepwarm/warmer"
)

// cmdFetch is `keepwarm fetch`: run a keyspace's query for some ids and print, for each, the key and the bytes
// the daemon would write (or what it would do about a missing id). It never touches Redis.
func cmdFetch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fetch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "config.toml", "config file (TOML)")
	keyspace := fs.String("keyspace", "", "the keyspace whose query to run (required)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: keepwarm fetch [--config config.toml] --keyspace NAME ID...")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *keyspace == "" {
		return usagef("fetch: --keyspace is required")
	}
	if fs.NArg() == 0 {
		return usagef("fetch: give at least one id")
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	ks := cfg.Keyspace(*keyspace)
	if ks == nil {
		var names []string
		for _, k := range cfg.Keyspaces {
			names = append(names, k.Name)
		}
		return usagef("fetch: no keyspace %q in %s (known: %s)", *keyspace, *path, strings.Join(names, ", "))
	}
	var ids []string
	keys := map[string]string{}
	for _, id := range fs.Args() {
		set, err := ks.Keys().For(id)
		if err != nil {
			return usagef("fetch: id %q: %v", id, err)
		}
		if _, dup := keys[id]; !dup {
			ids = append(ids, id)
			keys[id] = set.Cache
		}
	}

	pool, err := postgres.NewPool(ctx, cfg.Postgres.DSN, 1, cfg.Postgres.ConnectTimeout)
	if err != nil {
		return err
	}
	defer pool.Close()
	src, err := postgres.New(pool, postgres.Config{Keyspace: ks.Name, Query: ks.Query, StatementTimeout: cfg.Postgres.StatementTimeout,
		PoolWaitTimeout: cfg.Postgres.PoolWaitTimeout})
	if err != nil {
		return err
	}
	values, _, err := src.Fetch(ctx, ids)
	if err != nil {
		return err
	}
	for i, id := range ids {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		key := keys[id]
		v, ok := values[id]
		switch {
		case !ok:
			fmt.Fprintf(stdout, "%s: missing: %s\n", key, missingAction(ks))
		case len(v) > ks.MaxValueBytes:
			fmt.Fprintf(stdout, "%s: %d bytes, more than max_value_bytes (%d): would not be written\n", key, len(v), ks.MaxValueBytes)
		default:
			fmt.Fprintf(stdout, "%s: %d bytes, ttl %s..%s (jitter %g)\n%s\n", key, len(v), ks.TTL,
				time.Duration(float64(ks.TTL)*(1+ks.Jitter)), ks.Jitter, printable(v))
		}
	}
	return nil
}

func missingAction(ks *config.Keyspace) string {
	switch ks.Missing {
	case warmer.MissingKeep:
		return `missing = "keep": would leave the key as it is`
	case warmer.MissingTombstone:
		return fmt.Sprintf(`missing = "tombstone": would write %s (%d bytes), ttl %s`,
			printable(ks.Tombstone), len(ks.Tombstone), ks.TombstoneTTL)
	default:
		return `missing = "delete": would delete the key`
	}
}

// printable returns text values as they are and binary ones (bytea that is not UTF-8) Go-quoted.
func printable(v []byte) string {
	if utf8.Valid(v) {
		return string(v)
	}
	return fmt.Sprintf("%q", v)
}
