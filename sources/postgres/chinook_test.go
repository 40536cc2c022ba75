package postgres_test

import (
	"bytes"
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/examples/chinook"
	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/sources/postgres"
)

// TestChinookMatchesPsql runs each demo keyspace's query from config.toml through Fetch and through psql, and
// checks that the bytes are the same: what keepwarm writes to Redis is exactly what PostgreSQL prints.
func TestChinookMatchesPsql(t *testing.T) {
	t.Parallel()
	testenv.Postgres(t) // fails with a how-to-start message when PostgreSQL is down
	dsn, err := chinook.DSNFor(testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := chinook.Load(ctx, dsn); err != nil {
		t.Fatalf("load chinook: %v", err)
	}
	cfg, err := config.LoadEnv("../../config.toml", nil)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := postgres.NewPool(ctx, dsn, 4, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	known := map[string][]string{
		"track":       {"1", "2", "1000", "3503"},
		"album":       {"1", "100", "347"},
		"artist":      {"1", "22", "275"},
		"chart-genre": {"1", "2", "25"}, // 25 (Opera) sold nothing: an empty chart, not missing
	}
	absent := []string{"0", "999999", "abc", "1; drop table track", "１"} // the last is a full-width digit
	for _, ks := range cfg.Keyspaces {
		t.Run(ks.Name, func(t *testing.T) {
			ids := known[ks.Name]
			if len(ids) == 0 {
				t.Fatalf("no test ids for keyspace %q: add them", ks.Name)
			}
			src, err := postgres.New(pool, postgres.Config{Keyspace: ks.Name, Query: ks.Query, IDsQuery: ks.IDsQuery, StatementTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if err := src.Check(ctx); err != nil {
				t.Fatalf("Check: %v", err)
			}
			values, missing, err := src.Fetch(ctx, append(slices.Clone(ids), absent...))
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			if !slices.Equal(missing, absent) {
				t.Errorf("missing: got %q, want %q", missing, absent)
			}
			want := psql(t, dsn, ks.Query, ids)
			if len(values) != len(ids) || len(want) != len(ids) {
				t.Fatalf("got %d values from Fetch and %d rows from psql, want %d", len(values), len(want), len(ids))
			}
			for _, id := range ids {
				if !bytes.Equal(values[id], want[id]) {
					t.Errorf("id %s: Fetch gave\n%s\npsql prints\n%s", id, values[id], want[id])
				}
			}
		})
	}
}

// psql runs query with ids through psql (unaligned, unit and record separators) and returns id -> value.
func psql(t *testing.T, dsn, query string, ids []string) map[string][]byte {
	t.Helper()
	script := "prepare q(text[]) as " + query + ";\nexecute q(:'ids');\n"
	cmd := exec.Command("psql", dsn, "-X", "-q", "-A", "-t", "-F", "\x1f", "-R", "\x1e", "-v", "ON_ERROR_STOP=1",
		"-v", "ids={"+strings.Join(ids, ",")+"}", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("psql: %v: %s (is /usr/bin/psql installed? scripts/services up installs it)", err, stderr.String())
	}
	rows := map[string][]byte{}
	for _, rec := range bytes.Split(bytes.TrimSuffix(out, []byte("\n")), []byte("\x1e")) {
		id, value, ok := bytes.Cut(rec, []byte("\x1f"))
		if !ok {
			t.Fatalf("psql: unexpected record %q", rec)
		}
		rows[string(id)] = value
	}
	return rows
}

// TestChinookIDs lists every track id of the demo with the keyspace's ids_query.
func TestChinookIDs(t *testing.T) {
	t.Parallel()
	testenv.Postgres(t)
	dsn, err := chinook.DSNFor(testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := chinook.Load(ctx, dsn); err != nil {
		t.Fatalf("load chinook: %v", err)
	}
	cfg, err := config.LoadEnv("../../config.toml", nil)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := postgres.NewPool(ctx, dsn, 2, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ks := cfg.Keyspace("track")
	src, err := postgres.New(pool, postgres.Config{Keyspace: ks.Name, Query: ks.Query, IDsQuery: ks.IDsQuery})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	last := ""
	if err := src.IDs(ctx, func(id string) error { n++; last = id; return nil }); err != nil {
		t.Fatal(err)
	}
	if n != chinook.Tracks || last != "3503" {
		t.Errorf("IDs: got %d ids ending with %q, want %d ending with 3503", n, last, chinook.Tracks)
	}
}
