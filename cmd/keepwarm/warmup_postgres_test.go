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
// (issue 11: the ids stream held the pool's only connection and 3,200 of 3,503 ids failed).
func TestWarmupQueryOneConnection(t *testing.T) {
	t.Setenv("KEEPWARM_POSTGRES_DSN", chinookDSN(t))
	t.Setenv("KEEPWARM_POSTGRES_MAX_CONNS", "1")
	rdb := testenv.Redis(t)
	path := prefixedDemoConfig(t, testenv.Prefix(t, rdb))
	stdout, stderr, code := keepwarm(t, "warmup", "--config", path, "--keyspace", "track", "--query")
	if code != 0 || !strings.Contains(stdout, "written 3503 ") || !strings.Contains(stdout, "failed 0") {
		t.Fatalf("warmup --query with max_conns 1: exit %d, want 3503 written and 0 failed\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}

// TestWarmupThroughPgBouncer runs `keepwarm warmup --query` twice over every Chinook track through PgBouncer in
// transaction mode, with the documented DSN (default_query_exec_mode=exec). Issue 11: with the default DSN more
// than half of the 3,503 ids failed with SQLSTATE 42P05, and a second warmup failed before it started.
func TestWarmupThroughPgBouncer(t *testing.T) {
	chinookDSN(t) // loads the demo data directly, not through PgBouncer
	pgb := os.Getenv("KEEPWARM_PGBOUNCER_URL")
	if pgb == "" {
		pgb = "postgres://keepwarm@127.0.0.1:16432/keepwarm?sslmode=disable&default_query_exec_mode=exec"
	}
	dsn := strings.Replace(pgb, "/keepwarm?", "/chinook?", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pool, err := postgres.NewPool(ctx, dsn, 1, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		t.Fatalf("pgbouncer at %s is not reachable (%v): start it with `scripts/services up pgbouncer` (make test does)", dsn, err)
	}
	pool.Close()
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
