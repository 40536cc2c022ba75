package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/sources/postgres"
)

// smallPool returns a pool of maxConns connections on the test database, with extra DSN settings.
func smallPool(t *testing.T, maxConns int32, extra string) *pgxpool.Pool {
	t.Helper()
	testenv.Postgres(t) // fails with a how-to-start message when PostgreSQL is down
	dsn := testenv.PostgresURL()
	if extra != "" {
		dsn = withParam(dsn, extra)
	}
	pool, err := postgres.NewPool(context.Background(), dsn, maxConns, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestPoolExhausted holds the only connection of a max_conns = 1 pool: Fetch must give up after PoolWaitTimeout
// with ErrPoolExhausted, say "pool exhausted (max_conns 1)", not claim a query timeout, and record the wait.
func TestPoolExhausted(t *testing.T) {
	t.Parallel()
	pool := smallPool(t, 1, "")
	reg := prometheus.NewPedanticRegistry()
	src, err := postgres.New(pool, postgres.Config{Keyspace: "tight", Query: "select id, id from unnest($1::text[]) as id",
		StatementTimeout: 5 * time.Second, PoolWaitTimeout: 100 * time.Millisecond}, postgres.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	// A second source on the same registry shares the histogram instead of failing to register.
	other, err := postgres.New(pool, postgres.Config{Keyspace: "other", Query: "select id, id from unnest($1::text[]) as id"},
		postgres.WithRegisterer(reg))
	if err != nil {
		t.Fatalf("New with a registry already holding the metrics: %v", err)
	}
	if _, _, err := other.Fetch(context.Background(), []string{"1"}); err != nil {
		t.Fatalf("Fetch on a free pool: %v", err)
	}

	held, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // far above the 100ms bound
	defer cancel()
	_, _, err = src.Fetch(ctx, []string{"1"})
	held.Release()
	switch {
	case !errors.Is(err, postgres.ErrPoolExhausted):
		t.Fatalf("Fetch with the only connection held: got error %v, want ErrPoolExhausted", err)
	case !strings.Contains(err.Error(), "pool exhausted (max_conns 1)") || !strings.Contains(err.Error(), `keyspace "tight"`):
		t.Errorf("Fetch: got error %q, want it to name the keyspace and say %q", err, "pool exhausted (max_conns 1)")
	case errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "timeout after"):
		t.Errorf("Fetch: got error %q, which reads as a query timeout; the query never ran", err)
	}
	if got := testutil.CollectAndCount(reg, "keepwarm_origin_pool_wait_seconds"); got != 2 {
		t.Errorf("keepwarm_origin_pool_wait_seconds: got %d series, want 2 (one per keyspace)", got)
	}
	// The cut-off wait is recorded: one observation of at least the 100ms bound for keyspace "tight".
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var count uint64
	var sum float64
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == "keepwarm_origin_pool_wait_seconds" && m.GetLabel()[0].GetValue() == "tight" {
				count, sum = m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
			}
		}
	}
	if count != 1 || sum < 0.1 {
		t.Errorf("keepwarm_origin_pool_wait_seconds{keyspace=\"tight\"}: got %d observations summing to %gs, want 1 of at least 0.1s", count, sum)
	}
	if problems, err := testutil.CollectAndLint(reg); err != nil || len(problems) != 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	// The connection came back: the pool works again.
	if values, _, err := src.Fetch(ctx, []string{"x"}); err != nil || string(values["x"]) != "x" {
		t.Errorf("Fetch after release: got %q, %v", values, err)
	}
}

// TestNewPoolWaitTimeoutBounds checks New's bounds on PoolWaitTimeout.
func TestNewPoolWaitTimeoutBounds(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	for _, d := range []time.Duration{-time.Millisecond, time.Nanosecond, postgres.MinPoolWaitTimeout - 1, postgres.MaxPoolWaitTimeout + time.Second} {
		_, err := postgres.New(pool, postgres.Config{Keyspace: "k", Query: "q", PoolWaitTimeout: d})
		if err == nil || !strings.Contains(err.Error(), "pool wait timeout") {
			t.Errorf("New(PoolWaitTimeout %s): got %v, want an error naming the pool wait timeout", d, err)
		}
	}
}

// TestIDsDoesNotStarveFetch streams ids_query with max_conns = 1 and fetches each batch from inside the stream,
// as `keepwarm warmup --query` does: the stream must not hold the connection that Fetch needs (when it did,
// 3,200 of 3,503 ids failed).
func TestIDsDoesNotStarveFetch(t *testing.T) {
	t.Parallel()
	pool := smallPool(t, 1, "")
	src := newSource(t, pool, postgres.Config{Keyspace: "stream", Query: "select id, 'v' || id from unnest($1::text[]) as id",
		IDsQuery: "select generate_series(1, 3503)::text", StatementTimeout: 5 * time.Second, PoolWaitTimeout: 2 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var batch []string
	fetched := 0
	flush := func() error {
		values, missing, err := src.Fetch(ctx, batch)
		if err != nil {
			return err
		}
		if len(values) != len(batch) || len(missing) != 0 {
			return fmt.Errorf("got %d values and %d missing for %d ids", len(values), len(missing), len(batch))
		}
		fetched += len(values)
		batch = batch[:0]
		return nil
	}
	err := src.IDs(ctx, func(id string) error {
		if batch = append(batch, id); len(batch) == 500 {
			return flush()
		}
		return nil
	})
	if err == nil && len(batch) > 0 {
		err = flush()
	}
	if err != nil || fetched != 3503 {
		t.Fatalf("IDs with Fetch inside, max_conns 1: fetched %d of 3503, error %v", fetched, err)
	}
}

// TestStatementTimeoutKeepsConnections runs queries that time out and counts the connections the pool had to
// open: with the server-side statement_timeout none (pgx's client-side cancel closed one per timeout).
func TestStatementTimeoutKeepsConnections(t *testing.T) {
	t.Parallel()
	for _, mode := range execModes {
		t.Run(mode, func(t *testing.T) {
			pool := smallPool(t, 2, "default_query_exec_mode="+mode)
			src := newSource(t, pool, postgres.Config{Keyspace: "slow",
				Query:            "select id, case when id = 'slow' then pg_sleep(30)::text else id end from unnest($1::text[]) as id",
				StatementTimeout: 50 * time.Millisecond})
			if _, _, err := src.Fetch(context.Background(), []string{"fast"}); err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			before := pool.Stat().NewConnsCount()
			const n = 20
			for i := range n {
				_, _, err := src.Fetch(context.Background(), []string{"slow"})
				var pgErr *pgconn.PgError
				if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &pgErr) || pgErr.Code != "57014" || !strings.Contains(err.Error(), "timeout") {
					t.Fatalf("Fetch %d: got error %v, want a server-side timeout (SQLSTATE 57014) wrapping context.DeadlineExceeded", i, err)
				}
			}
			if values, _, err := src.Fetch(context.Background(), []string{"fast"}); err != nil || string(values["fast"]) != "fast" {
				t.Fatalf("Fetch after the timeouts: got %q, %v", values, err)
			}
			opened := pool.Stat().NewConnsCount() - before
			t.Logf("%d timed-out queries opened %d new connections", n, opened)
			if opened != 0 {
				t.Errorf("%d timed-out queries opened %d new connections, want 0: the timeout must not cost the connection", n, opened)
			}
		})
	}
}

// TestPreparedStatementHint makes the server lose pgx's cached prepared statement, as a transaction-pooling
// PgBouncer does when the next transaction lands on another server connection: the error must say what to
// change in the DSN.
func TestPreparedStatementHint(t *testing.T) {
	t.Parallel()
	pool := smallPool(t, 1, "default_query_exec_mode=cache_statement")
	src := newSource(t, pool, postgres.Config{Keyspace: "pgb", Query: "select id, id from unnest($1::text[]) as id", StatementTimeout: 5 * time.Second})
	ctx := context.Background()
	if _, _, err := src.Fetch(ctx, []string{"1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "deallocate all"); err != nil { // the same, only connection
		t.Fatal(err)
	}
	_, _, err := src.Fetch(ctx, []string{"1"})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "26000" {
		t.Fatalf("Fetch after the server lost the statement: got %v, want SQLSTATE 26000", err)
	}
	if !strings.Contains(err.Error(), "default_query_exec_mode=exec") || !strings.Contains(err.Error(), "PgBouncer") {
		t.Errorf("Fetch: got error %q, want it to say to set default_query_exec_mode=exec in the dsn", err)
	}
}

// TestCallerDeadlineKeepsConnections: when the caller's deadline comes before StatementTimeout (or there is no
// StatementTimeout), the server-side timeout follows the deadline, so the connection survives that too.
func TestCallerDeadlineKeepsConnections(t *testing.T) {
	t.Parallel()
	pool := smallPool(t, 2, "")
	for _, timeout := range []time.Duration{time.Minute, 0} {
		t.Run(fmt.Sprint(timeout), func(t *testing.T) {
			src := newSource(t, pool, postgres.Config{Keyspace: "slow",
				Query:            "select id, case when id = 'slow' then pg_sleep(30)::text else id end from unnest($1::text[]) as id",
				StatementTimeout: timeout})
			if _, _, err := src.Fetch(context.Background(), []string{"fast"}); err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			before := pool.Stat().NewConnsCount()
			for i := range 5 {
				ctx, cancel := context.WithTimeout(context.Background(), postgres.ClientTimeoutMargin+100*time.Millisecond)
				_, _, err := src.Fetch(ctx, []string{"slow"})
				cancel()
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Fetch %d: got error %v, want one wrapping context.DeadlineExceeded", i, err)
				}
			}
			if opened := pool.Stat().NewConnsCount() - before; opened != 0 {
				t.Errorf("5 queries cut off by the caller's deadline opened %d new connections, want 0", opened)
			}
		})
	}
}
