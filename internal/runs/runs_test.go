package runs_test

import (
	"context"
	"database/sql"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/keepwarm/keepwarm/internal/runs"
	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/migrations"
	"github.com/keepwarm/keepwarm/warmer"
)

// migrated returns a pool on a throwaway database with keepwarm's migrations applied.
func migrated(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	url := testenv.Database(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := migrations.Up(ctx, db, io.Discard); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func status(t *testing.T, pool *pgxpool.Pool, id int64) (st string, errText *string) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `select status, error from keepwarm.warmup_runs where id = $1`, id).Scan(&st, &errText); err != nil {
		t.Fatal(err)
	}
	return st, errText
}

// A warmup whose process is killed with -9 never calls Finish: its row stays 'running' and its heartbeat stops.
// Once the heartbeat is older than StaleAfter, the next run's Start (or a daemon start) marks it interrupted,
// saying why. A run that is alive (fresh heartbeat) and a row of an older binary (no heartbeat) are left alone.
func TestStaleRunsAreMarkedInterrupted(t *testing.T) {
	pool := migrated(t)
	ctx := context.Background()
	rec := runs.New(pool, "test-host")
	killed, err := rec.Start(ctx, "killed", warmer.TriggerCLI, "items")
	if err != nil {
		t.Fatal(err)
	}
	alive, err := rec.Start(ctx, "alive", warmer.TriggerCLI, "items")
	if err != nil {
		t.Fatal(err)
	}
	var old int64
	if err := pool.QueryRow(ctx, `insert into keepwarm.warmup_runs (name, trigger, keyspace, host, started_at, heartbeat_at)
		values ('old binary', 'cli', 'items', 'h', now() - interval '1 hour', null) returning id`).Scan(&old); err != nil {
		t.Fatal(err)
	}
	// The killed process's heartbeat stopped StaleAfter and more ago (what the clock would show after the kill).
	if _, err := pool.Exec(ctx, `update keepwarm.warmup_runs set heartbeat_at = now() - make_interval(secs => $2) where id = $1`,
		killed, (runs.StaleAfter + time.Second).Seconds()); err != nil {
		t.Fatal(err)
	}
	next, err := rec.Start(ctx, "next", warmer.TriggerCLI, "items")
	if err != nil {
		t.Fatal(err)
	}
	if st, e := status(t, pool, killed); st != "interrupted" || e == nil {
		t.Errorf("killed run: status %q, error %v; want interrupted with a reason", st, e)
	} else {
		t.Logf("killed run's error: %s", *e)
	}
	for _, id := range []int64{alive, old, next} {
		if st, _ := status(t, pool, id); st != "running" {
			t.Errorf("run %d: status %q, want running (alive, or without heartbeat)", id, st)
		}
	}
	for _, id := range []int64{alive, next} {
		if err := rec.Finish(ctx, id, warmer.WarmupResult{}, nil); err != nil {
			t.Fatal(err)
		}
		if st, _ := status(t, pool, id); st != "ok" {
			t.Errorf("run %d after Finish: status %q, want ok", id, st)
		}
	}
	if n, err := rec.SweepStale(ctx); err != nil || n != 0 {
		t.Errorf("second sweep: %d rows, %v; want 0, nil", n, err)
	}
}
