package migrations_test

import (
	"bytes"
	"context"
	"database/sql"
	"net/url"
	"strings"
	"sync"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/migrations"
)

// freshDB creates a throwaway database (other tests share the database keepwarm) and drops it on cleanup.
func freshDB(t *testing.T) *sql.DB {
	db, _ := freshDBURL(t)
	return db
}

// freshDBURL is freshDB that also returns the database's URL.
func freshDBURL(t *testing.T) (*sql.DB, string) {
	t.Helper()
	dbURL := testenv.Database(t)
	db, err := sql.Open("pgx", dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() }) // runs before the database's drop, registered earlier
	return db, dbURL
}

// TestStatusIsReadOnly runs `migrate status` as a read-only session (default_transaction_read_only, as a
// read-only role or a hot standby has it): before any migration (no schema yet) and after them. It used to run
// "create schema if not exists" and fail.
func TestStatusIsReadOnly(t *testing.T) {
	db, dbURL := freshDBURL(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if u.RawQuery != "" {
		u.RawQuery += "&"
	}
	u.RawQuery += "options=-c%20default_transaction_read_only%3Don"
	ro, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ro.Close() })
	if _, err := ro.Exec("create schema should_fail"); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("the read-only session could create a schema (err %v): the test would prove nothing", err)
	}
	out := run(t, ro, status)
	if !strings.Contains(out, "pending") || strings.Contains(out, "applied") {
		t.Errorf("status before any migration: got\n%s\nwant every migration pending", out)
	}
	run(t, db, up)
	out = run(t, ro, status)
	if !strings.Contains(out, "applied") || strings.Contains(out, "pending") {
		t.Errorf("status after up: got\n%s\nwant every migration applied", out)
	}
}

func tableExists(t *testing.T, db *sql.DB) bool {
	t.Helper()
	var ok bool
	if err := db.QueryRow("select to_regclass('keepwarm.warmup_runs') is not null").Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func run(t *testing.T, db *sql.DB, f func(context.Context, *sql.DB, *bytes.Buffer) error) string {
	t.Helper()
	var out bytes.Buffer
	if err := f(context.Background(), db, &out); err != nil {
		t.Fatalf("%v\noutput:\n%s", err, out.String())
	}
	return out.String()
}

func up(ctx context.Context, db *sql.DB, out *bytes.Buffer) error { return migrations.Up(ctx, db, out) }
func down(ctx context.Context, db *sql.DB, out *bytes.Buffer) error {
	return migrations.Down(ctx, db, out)
}
func status(ctx context.Context, db *sql.DB, out *bytes.Buffer) error {
	return migrations.Status(ctx, db, out)
}

func TestUpDownUp(t *testing.T) {
	db := freshDB(t)

	out := run(t, db, up)
	if !strings.Contains(out, "OK    up 00001_warmup_runs.sql") || !strings.Contains(out, "OK    up 00002_warmup_runs_heartbeat.sql") ||
		!strings.Contains(out, "now at version 2") || !tableExists(t, db) {
		t.Fatalf("first up: got\n%s", out)
	}
	if out := run(t, db, up); !strings.Contains(out, "up to date at version 2") {
		t.Errorf("second up: got %q, want up to date", out)
	}
	if out := run(t, db, status); !strings.Contains(out, "1        applied") || !strings.Contains(out, "00001_warmup_runs.sql") ||
		!strings.Contains(out, "2        applied") {
		t.Errorf("status: got\n%s", out)
	}
	var table string
	if err := db.QueryRow("select schemaname || '.' || tablename from pg_tables where tablename = 'goose_db_version'").Scan(&table); err != nil || table != migrations.VersionTable {
		t.Errorf("goose version table: got %q (%v), want %s", table, err, migrations.VersionTable)
	}

	// The table takes a run and enforces its checks.
	if _, err := db.Exec(`insert into keepwarm.warmup_runs (name, trigger, keyspace, host) values ('nightly', 'cron', 'track', 'h1')`); err != nil {
		t.Errorf("insert a running run: %v", err)
	}
	for _, bad := range []string{
		`insert into keepwarm.warmup_runs (name, trigger, keyspace, host) values ('x', 'manual', 'track', 'h1')`,
		`insert into keepwarm.warmup_runs (name, trigger, keyspace, host, status) values ('x', 'cli', 'track', 'h1', 'ok')`,
		`insert into keepwarm.warmup_runs (name, trigger, keyspace, host, written) values ('x', 'cli', 'track', 'h1', -1)`,
	} {
		if _, err := db.Exec(bad); err == nil || !strings.Contains(err.Error(), "23514") {
			t.Errorf("%s: got %v, want a check violation (23514)", bad, err)
		}
	}

	if out := run(t, db, down); !strings.Contains(out, "OK    down 00002_warmup_runs_heartbeat.sql") || !strings.Contains(out, "now at version 1") {
		t.Fatalf("down: got\n%s", out)
	}
	if out := run(t, db, down); !strings.Contains(out, "OK    down 00001_warmup_runs.sql") || !strings.Contains(out, "now at version 0") || tableExists(t, db) {
		t.Fatalf("down: got\n%s", out)
	}
	if out := run(t, db, down); !strings.Contains(out, "nothing to roll back") {
		t.Errorf("second down: got %q", out)
	}
	if out := run(t, db, status); !strings.Contains(out, "pending") {
		t.Errorf("status after down: got\n%s", out)
	}
	if out := run(t, db, up); !strings.Contains(out, "OK    up 00001_warmup_runs.sql") || !tableExists(t, db) {
		t.Fatalf("up after down: got\n%s", out)
	}
}

// TestConcurrentUp checks that the advisory lock lets several processes migrate at once safely.
func TestConcurrentUp(t *testing.T) {
	db := freshDB(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out bytes.Buffer
			errs <- migrations.Up(context.Background(), db, &out)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent Up: %v", err)
		}
	}
	if !tableExists(t, db) {
		t.Error("table missing after concurrent Up")
	}
}
