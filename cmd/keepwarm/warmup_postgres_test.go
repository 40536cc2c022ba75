package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/sources/postgres"
)

// TestWarmupQueryOneConnection runs `keepwarm warmup --query` over every Chinook track with max_conns = 1
// (when the ids stream held the pool's only connection, 3,200 of 3,503 ids failed).
func TestWarmupQueryOneConnection(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	t.Setenv("KEEPWARM_POSTGRES_DSN", chinookDSN(t))
	t.Setenv("KEEPWARM_POSTGRES_MAX_CONNS", "1")
	rdb := testenv.Redis(t)
	path := prefixedDemoConfig(t, testenv.Prefix(t, rdb))
	stdout, stderr, code := keepwarm(t, "warmup", "--config", path, "--keyspace", "track", "--query")
	if code != 0 || !strings.Contains(stdout, "written 3503 ") || !strings.Contains(stdout, "failed 0") {
		t.Fatalf("warmup --query with max_conns 1: exit %d, want 3503 written and 0 failed\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}

// pingPgBouncer fails the test, saying how to start PgBouncer, when dsn does not answer.
func pingPgBouncer(t *testing.T, dsn string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pool, err := postgres.NewPool(ctx, dsn, 1, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("pgbouncer at %s is not reachable (%v): start it with `scripts/services up pgbouncer` (make test does)", dsn, err)
	}
}

// pgBouncerChinookDSN is the Chinook database through the PgBouncer of `scripts/services up pgbouncer`, with
// the DSN setting keepwarm needs there (default_query_exec_mode=exec).
func pgBouncerChinookDSN(t *testing.T) string {
	t.Helper()
	chinookDSN(t) // loads the demo data directly, not through PgBouncer
	pgb := os.Getenv("KEEPWARM_PGBOUNCER_URL")
	if pgb == "" {
		pgb = "postgres://keepwarm@127.0.0.1:16432/keepwarm?sslmode=disable&default_query_exec_mode=exec"
	}
	dsn := strings.Replace(pgb, "/keepwarm?", "/chinook?", 1)
	pingPgBouncer(t, dsn)
	return dsn
}

// TestValidateBehindPgBouncer: validate --check-db must reject pgx's default statement cache behind a
// transaction-pooling PgBouncer, saying what to set in the dsn, and accept the dsn with that setting. The demo
// config streams changes, which needs a replication connection that PgBouncer 1.18 does not pass: without a
// [changes] dsn pointing at PostgreSQL itself, --check-db says so (run's stream would retry forever).
func TestValidateBehindPgBouncer(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	t.Setenv("KEEPWARM_CHANGES_DSN", chinookDSN(t))
	fixed := pgBouncerChinookDSN(t)
	broken := strings.Replace(fixed, "default_query_exec_mode=exec", "default_query_exec_mode=cache_statement", 1)
	t.Setenv("KEEPWARM_POSTGRES_DSN", broken)
	stdout, stderr, code := keepwarm(t, "validate", "--config", demoConfig, "--check-db")
	if code == 0 || !strings.Contains(stderr, "SQLSTATE 42P05") || !strings.Contains(stderr, "add default_query_exec_mode=exec to the [postgres] dsn") {
		t.Errorf("validate --check-db, default statement cache behind PgBouncer: exit %d, want non-zero with the dsn hint\n%s%s", code, stdout, stderr)
	}
	t.Setenv("KEEPWARM_POSTGRES_DSN", fixed)
	if stdout, stderr, code := keepwarm(t, "validate", "--config", demoConfig, "--check-db"); code != 0 {
		t.Errorf("validate --check-db with default_query_exec_mode=exec behind PgBouncer: exit %d\n%s%s", code, stdout, stderr)
	}
	t.Setenv("KEEPWARM_CHANGES_DSN", "")
	_, stderr, code = keepwarm(t, "validate", "--config", demoConfig, "--check-db")
	if want := "point [changes] dsn (KEEPWARM_CHANGES_DSN) at PostgreSQL itself"; code != 1 || !strings.Contains(stderr, want) {
		t.Errorf("validate --check-db, the change stream through PgBouncer: exit %d, want 1 and %q\n%s", code, want, stderr)
	}
}

// TestWarmupThroughPgBouncer runs `keepwarm warmup --query` twice over every Chinook track through PgBouncer in
// transaction mode, with the documented DSN (default_query_exec_mode=exec). With the default DSN more
// than half of the 3,503 ids fail with SQLSTATE 42P05, and a second warmup fails before it starts.
func TestWarmupThroughPgBouncer(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	dsn := pgBouncerChinookDSN(t)
	t.Setenv("KEEPWARM_POSTGRES_DSN", dsn)
	rdb := testenv.Redis(t)
	path := prefixedDemoConfig(t, testenv.Prefix(t, rdb))
	for run := 1; run <= 2; run++ {
		stdout, stderr, code := keepwarm(t, "warmup", "--config", path, "--keyspace", "track", "--query")
		if code != 0 || !strings.Contains(stdout, "failed 0") || strings.Contains(stdout, "written 0 ") {
			t.Fatalf("warmup %d through PgBouncer: exit %d, want every id written or skipped and 0 failed\nstdout:\n%s\nstderr:\n%s", run, code, stdout, stderr)
		}
		t.Logf("warmup %d: %s", run, strings.TrimSpace(stdout))
	}
}
