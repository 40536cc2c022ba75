package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/sources/postgres"
)

// defaultPgBouncerURL is the PgBouncer that `scripts/services up pgbouncer` starts (pool_mode = transaction),
// with the DSN setting keepwarm needs behind it.
const defaultPgBouncerURL = "postgres://keepwarm@127.0.0.1:16432/keepwarm?sslmode=disable&default_query_exec_mode=exec"

func pgBouncerURL() string {
	if u := os.Getenv("KEEPWARM_PGBOUNCER_URL"); u != "" {
		return u
	}
	return defaultPgBouncerURL
}

// pgBouncerPool returns a pool of maxConns through PgBouncer on dsn, failing the test with a how-to-start
// message when PgBouncer does not answer.
func pgBouncerPool(t *testing.T, dsn string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pool, err := postgres.NewPool(ctx, dsn, maxConns, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		t.Fatalf("pgbouncer at %s is not reachable (%v): start it with `scripts/services up pgbouncer` "+
			"(or `make test`, which does), or point KEEPWARM_PGBOUNCER_URL at a PgBouncer in transaction mode", dsn, err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// setDSNParam returns dsn with key=value set, replacing the key's current value.
func setDSNParam(dsn, key, value string) string {
	base, query, _ := strings.Cut(dsn, "?")
	var kept []string
	for _, kv := range strings.Split(query, "&") {
		if kv != "" && !strings.HasPrefix(kv, key+"=") {
			kept = append(kept, kv)
		}
	}
	return base + "?" + strings.Join(append(kept, key+"="+value), "&")
}

// TestPgBouncerWarmup runs a warmup-sized fetch through PgBouncer in transaction mode, with the documented DSN
// setting (default_query_exec_mode=exec): 3,503 ids streamed from ids_query, fetched in batches of 500 by four
// goroutines, twice (with the default DSN more than half of them fail with SQLSTATE 42P05, and a second
// warmup fails before it starts). Values are jsonb and bytea, which come back in text format here.
func TestPgBouncerWarmup(t *testing.T) {
	// Serial: PgBouncer's pool (transaction mode) is shared; its server connections carry other clients' prepared statements.
	direct := testenv.Postgres(t)
	pgb := pgBouncerPool(t, pgBouncerURL(), 8)
	const n = 3503
	kv := table(t, direct, "jsonb", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := direct.Exec(ctx, "insert into "+kv+" select i::text, jsonb_build_object('id', i, 'name', 'track ' || i) from generate_series(1, $1::int) i", n); err != nil {
		t.Fatal(err)
	}
	for _, valueSQL := range []string{"value", "convert_to(value::text, 'UTF8')"} { // jsonb, then bytea
		src := newSource(t, pgb, postgres.Config{Keyspace: "pgbouncer",
			Query:            "select id, " + valueSQL + " from " + kv + " where id = any($1::text[])",
			IDsQuery:         "select id from " + kv + " order by id::int",
			StatementTimeout: 5 * time.Second})
		if err := src.Check(ctx); err != nil {
			t.Fatalf("Check through PgBouncer: %v", err)
		}
		for run := 1; run <= 2; run++ {
			batches := make(chan []string)
			var (
				mu      sync.Mutex
				fetched int
				errs    []error
				wg      sync.WaitGroup
			)
			for range 4 {
				wg.Go(func() {
					for batch := range batches {
						values, missing, err := src.Fetch(ctx, batch)
						mu.Lock()
						switch {
						case err != nil:
							errs = append(errs, err)
						case len(missing) != 0:
							errs = append(errs, fmt.Errorf("missing %q", missing))
						}
						for id, v := range values {
							i, _ := strconv.Atoi(id)
							if want := fmt.Sprintf(`{"id": %d, "name": "track %d"}`, i, i); string(v) != want {
								errs = append(errs, fmt.Errorf("id %s: got %q, want %q", id, v, want))
							}
						}
						fetched += len(values)
						mu.Unlock()
					}
				})
			}
			var batch []string
			err := src.IDs(ctx, func(id string) error {
				if batch = append(batch, id); len(batch) == 500 {
					batches <- batch
					batch = nil
				}
				return nil
			})
			if len(batch) > 0 {
				batches <- batch
			}
			close(batches)
			wg.Wait()
			if err != nil {
				t.Fatalf("%s run %d: IDs: %v", valueSQL, run, err)
			}
			if len(errs) > 0 || fetched != n {
				t.Fatalf("%s run %d: fetched %d of %d through PgBouncer; %d errors, first: %v", valueSQL, run, fetched, n, len(errs), errors.Join(errs[:min(len(errs), 1)]...))
			}
		}
	}
}

// TestPgBouncerStatementTimeout checks that the server-side statement timeout works through PgBouncer in
// transaction mode: the slow query fails as a timeout, no connection is lost, and the SET LOCAL does not leak
// into the next client's transaction on the same server connection.
func TestPgBouncerStatementTimeout(t *testing.T) {
	// Serial: PgBouncer's pool (transaction mode) is shared; its server connections carry other clients' prepared statements.
	pgb := pgBouncerPool(t, pgBouncerURL(), 1)
	src := newSource(t, pgb, postgres.Config{Keyspace: "slow",
		Query:            "select id, case when id = 'slow' then pg_sleep(30)::text else id end from unnest($1::text[]) as id",
		StatementTimeout: 100 * time.Millisecond})
	ctx := context.Background()
	if _, _, err := src.Fetch(ctx, []string{"fast"}); err != nil {
		t.Fatal(err)
	}
	before := pgb.Stat().NewConnsCount()
	for i := range 5 {
		if _, _, err := src.Fetch(ctx, []string{"slow"}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Fetch %d: got error %v, want a timeout", i, err)
		}
	}
	if opened := pgb.Stat().NewConnsCount() - before; opened != 0 {
		t.Errorf("5 timed-out queries through PgBouncer opened %d new connections, want 0", opened)
	}
	var setting string
	if err := pgb.QueryRow(ctx, "show statement_timeout").Scan(&setting); err != nil || setting != "0" {
		t.Errorf("statement_timeout outside Fetch: got %q, %v; want 0 (SET LOCAL must end with the transaction)", setting, err)
	}
}

// TestPgBouncerDefaultDSN shows the failure keepwarm's hint is for: with pgx's default statement cache, two
// clients whose transactions share a server connection (keepwarm_pool1 has exactly one) collide on the cached
// statement's name (SQLSTATE 42P05). The error must say what to change in the DSN; with that change, both work.
func TestPgBouncerDefaultDSN(t *testing.T) {
	// Serial: PgBouncer's pool (transaction mode) is shared; its server connections carry other clients' prepared statements.
	direct := testenv.Postgres(t)
	kv := table(t, direct, "text", map[string]any{"1": "one"})
	cfg := postgres.Config{Keyspace: "pgb", Query: "select id, value from " + kv + " where id = any($1::text[])", StatementTimeout: 5 * time.Second}
	single := strings.Replace(pgBouncerURL(), "/keepwarm?", "/keepwarm_pool1?", 1)
	ctx := context.Background()

	defaults := setDSNParam(single, "default_query_exec_mode", "cache_statement")
	a := newSource(t, pgBouncerPool(t, defaults, 1), cfg)
	b := newSource(t, pgBouncerPool(t, defaults, 1), cfg)
	_, _, errA := a.Fetch(ctx, []string{"1"})
	_, _, errB := b.Fetch(ctx, []string{"1"})
	var pgErr *pgconn.PgError
	if !errors.As(errB, &pgErr) || pgErr.Code != "42P05" {
		t.Fatalf("second client through one server connection: got error %v (first client: %v), want SQLSTATE 42P05", errB, errA)
	}
	if !strings.Contains(errB.Error(), "default_query_exec_mode=exec") {
		t.Errorf("Fetch: got error %q, want it to say to add default_query_exec_mode=exec to the dsn", errB)
	}

	for _, mode := range []string{"exec", "simple_protocol", "cache_describe"} { // cache_describe: unnamed statements
		fixed := setDSNParam(single, "default_query_exec_mode", mode)
		for i := range 2 {
			src := newSource(t, pgBouncerPool(t, fixed, 1), cfg)
			if values, _, err := src.Fetch(ctx, []string{"1"}); err != nil || string(values["1"]) != "one" {
				t.Errorf("%s, client %d: got %q, %v; want one", mode, i, values, err)
			}
		}
	}
}

// TestCheckStatementCache checks the probe validate runs: it must flag pgx's statement cache behind a
// transaction-pooling PgBouncer, with the hint, and pass directly on PostgreSQL and with the documented DSN.
func TestCheckStatementCache(t *testing.T) {
	// Serial: PgBouncer's pool (transaction mode) is shared; its server connections carry other clients' prepared statements.
	direct := testenv.PostgresURL()
	testenv.Postgres(t)
	pgb := pgBouncerURL()
	pool1 := strings.Replace(pgb, "/keepwarm?", "/keepwarm_pool1?", 1)
	tests := []struct {
		name, dsn string
		wantHint  bool
	}{
		{"postgres, default mode", direct, false},
		{"pgbouncer, default mode", setDSNParam(pool1, "default_query_exec_mode", "cache_statement"), true},
		{"pgbouncer, cache_describe", setDSNParam(pool1, "default_query_exec_mode", "cache_describe"), false}, // unnamed statements
		{"pgbouncer, exec", setDSNParam(pool1, "default_query_exec_mode", "exec"), false},
		{"pgbouncer, simple_protocol", setDSNParam(pool1, "default_query_exec_mode", "simple_protocol"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := smallPool(t, 2, "")
			if tt.dsn != direct {
				pool = pgBouncerPool(t, tt.dsn, 2)
			}
			err := postgres.CheckStatementCache(context.Background(), pool)
			switch {
			case tt.wantHint && (err == nil || !strings.Contains(err.Error(), "default_query_exec_mode=exec")):
				t.Errorf("CheckStatementCache: got %v, want an error with the DSN hint", err)
			case !tt.wantHint && err != nil:
				t.Errorf("CheckStatementCache: got %v, want nil", err)
			}
		})
	}
}
