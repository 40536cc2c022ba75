package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/sources/postgres"
	"github.com/keepwarm/keepwarm/sources/sourcetest"
)

// table creates schema.kv(id text, value <typ>) in a throwaway schema, fills it, and returns its
// qualified name.
func table(t *testing.T, pool *pgxpool.Pool, typ string, rows map[string]any) string {
	t.Helper()
	ctx := context.Background()
	name := pgx.Identifier{testenv.Schema(t, pool), "kv"}.Sanitize()
	if _, err := pool.Exec(ctx, fmt.Sprintf("create table %s (id text primary key, value %s)", name, typ)); err != nil {
		t.Fatalf("create table: %v", err)
	}
	for id, v := range rows {
		if _, err := pool.Exec(ctx, fmt.Sprintf("insert into %s (id, value) values ($1, $2)", name), id, v); err != nil {
			t.Fatalf("insert %q: %v", id, err)
		}
	}
	return name
}

func newSource(t *testing.T, pool *pgxpool.Pool, cfg postgres.Config) *postgres.Source {
	t.Helper()
	src, err := postgres.New(pool, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return src
}

func TestConformance(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	sourcetest.Run(t, func(t *testing.T) sourcetest.Fixture {
		known := map[string][]byte{
			"1":           []byte(`{"id":1}`),
			"2":           {0x00, 0xff, 0xfe, '\n', 0x00}, // not UTF-8, NUL bytes: bytea is raw
			"empty value": {},
		}
		for i, id := range sourcetest.OddIDs() {
			known[id] = []byte(fmt.Sprintf("odd value %d: %s", i, id))
		}
		rows := map[string]any{"null value": nil} // a NULL value is missing
		for id, v := range known {
			rows[id] = v
		}
		kv := table(t, pool, "bytea", rows)
		src := newSource(t, pool, postgres.Config{
			Keyspace:         "conformance",
			Query:            "select id, value from " + kv + " where id = any($1::text[])",
			IDsQuery:         "select id from " + kv + ` order by id collate "C"`,
			StatementTimeout: 5 * time.Second,
		})
		listed := []string{}
		for id := range rows {
			listed = append(listed, id)
		}
		sortBytes(listed)
		return sourcetest.Fixture{Source: src, Known: known, Listed: listed}
	})
}

func sortBytes(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// TestValueTypes checks that json, jsonb and text come back as the server's text form (what psql prints; jsonb
// carries a version byte in binary format that must not leak) and bytea as raw bytes.
func TestValueTypes(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	tests := []struct {
		typ  string
		in   string
		want string
	}{
		{"json", `{"b" : 1,   "a":[1, 2]}`, `{"b" : 1,   "a":[1, 2]}`}, // json keeps the input text
		{"jsonb", `{"b" : 1,   "a":[1, 2]}`, `{"a": [1, 2], "b": 1}`},  // jsonb normalises it
		{"text", "plain text, é", "plain text, é"},
		{"varchar(20)", "varchar", "varchar"},
		{"char(6)", "pad", "pad   "},
	}
	for _, tt := range tests {
		t.Run(tt.typ, func(t *testing.T) {
			kv := table(t, pool, tt.typ, map[string]any{"k": tt.in})
			src := newSource(t, pool, postgres.Config{Keyspace: "types", Query: "select id, value from " + kv + " where id = any($1)"})
			values, missing, err := src.Fetch(context.Background(), []string{"k"})
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			var psql []byte // the type's output function, which is what psql prints
			if err := pool.QueryRow(context.Background(), "select value from "+kv, pgx.QueryResultFormats{pgx.TextFormatCode}).Scan(&psql); err != nil {
				t.Fatal(err)
			}
			if got := string(values["k"]); got != tt.want || got != string(psql) || len(missing) != 0 {
				t.Errorf("Fetch: got %q (missing %q), want %q (server text form %q)", got, missing, tt.want, psql)
			}
		})
	}
}

func TestFetchErrors(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	kv := table(t, pool, "text", map[string]any{"a": "1", "b": "2"})
	tests := []struct {
		name  string
		query string
		want  []string // substrings of the error
		code  string   // SQLSTATE, if a server error
	}{
		{"missing table", "select id, value from no_such_table where id = any($1::text[])",
			[]string{`keyspace "errs": query:`, "no_such_table", "SQLSTATE 42P01"}, "42P01"},
		{"syntax error", "selec id, value from " + kv,
			[]string{`keyspace "errs": query:`, "SQLSTATE 42601"}, "42601"},
		{"bad cast in the query", "select id, (value || 'x')::int::text from " + kv + " where id = any($1::text[])",
			[]string{`keyspace "errs"`, "SQLSTATE 22P02"}, "22P02"},
		{"three columns", "select id, value, 1 from " + kv + " where id = any($1::text[])",
			[]string{`keyspace "errs"`, "query has 3 columns"}, ""},
		{"int value", "select id, 42 from " + kv + " where id = any($1::text[])",
			[]string{`keyspace "errs"`, "type int4", "cast it"}, ""},
		{"ignores $1", "select id, value from " + kv + " where $1::text[] is not null",
			[]string{`keyspace "errs"`, `returned id "b", which was not requested`}, ""},
		{"repeats an id", "select id, value from " + kv + " cross join generate_series(1, 2) where id = any($1::text[])",
			[]string{`keyspace "errs"`, `returned id "a" twice`}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := newSource(t, pool, postgres.Config{Keyspace: "errs", Query: tt.query, StatementTimeout: 5 * time.Second})
			values, missing, err := src.Fetch(context.Background(), []string{"a"})
			if err == nil {
				t.Fatalf("Fetch: got %q, %q and no error, want an error", values, missing)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Fetch: got error %q, want it to contain %q", err, w)
				}
			}
			var pgErr *pgconn.PgError
			if tt.code != "" && (!errors.As(err, &pgErr) || pgErr.Code != tt.code) {
				t.Errorf("Fetch: got error %v, want a *pgconn.PgError with code %s", err, tt.code)
			}
		})
	}
}

func TestFetchStatementTimeout(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	src := newSource(t, pool, postgres.Config{
		Keyspace:         "slow",
		Query:            "select id, pg_sleep(30)::text from unnest($1::text[]) as id",
		StatementTimeout: 200 * time.Millisecond,
	})
	start := time.Now()
	_, _, err := src.Fetch(context.Background(), []string{"1"})
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Fetch: got error %v, want one wrapping context.DeadlineExceeded", err)
	}
	for _, w := range []string{`keyspace "slow"`, "timeout"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Fetch: got error %q, want it to contain %q", err, w)
		}
	}
	t.Logf("timeout error: %v", err)
	if took > 5*time.Second {
		t.Errorf("Fetch took %s to time out after 200ms, want it to return promptly", took)
	}
	// The pool must still work after the cancelled query.
	ok := newSource(t, pool, postgres.Config{Keyspace: "ok", Query: "select id, 'v'::text from unnest($1::text[]) as id"})
	if values, _, err := ok.Fetch(context.Background(), []string{"x"}); err != nil || string(values["x"]) != "v" {
		t.Errorf("Fetch after a timeout: got %q, %v; want v", values, err)
	}
}

func TestFetchServerStatementTimeout(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	// The server's own statement_timeout (set by a DBA, or in the dsn) is also a timeout.
	cfg := pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "150"
	short, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(short.Close)
	src := newSource(t, short, postgres.Config{Keyspace: "slow", Query: "select id, pg_sleep(30)::text from unnest($1::text[]) as id"})
	_, _, err = src.Fetch(context.Background(), []string{"1"})
	var pgErr *pgconn.PgError
	if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &pgErr) || pgErr.Code != "57014" || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("Fetch: got error %v, want a timeout wrapping context.DeadlineExceeded and SQLSTATE 57014", err)
	}
}

func TestFetchCallerDeadline(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	src := newSource(t, pool, postgres.Config{Keyspace: "slow", Query: "select id, pg_sleep(30)::text from unnest($1::text[]) as id", StatementTimeout: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := src.Fetch(ctx, []string{"1"})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("Fetch: got error %v after %s, want context.DeadlineExceeded promptly", err, time.Since(start))
	}
}

func TestIDsStreams(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	// A billion rows: if IDs buffered them, or drained them on early exit, this would not finish.
	src := newSource(t, pool, postgres.Config{
		Keyspace: "big",
		Query:    "select id, id from unnest($1::text[]) as id",
		IDsQuery: "select generate_series(1, 1000000000)::text",
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stop := errors.New("enough")
	var got []string
	err := src.IDs(ctx, func(id string) error {
		got = append(got, id)
		if len(got) == 1000 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Fatalf("IDs: got error %v, want the callback's error", err)
	}
	if got[0] != "1" || got[999] != "1000" {
		t.Errorf("IDs: got %q ... %q, want 1 ... 1000", got[0], got[999])
	}
	// The connection went back to the pool in a usable state.
	if err := src.Ping(ctx); err != nil {
		t.Errorf("Ping after an interrupted IDs: %v", err)
	}
}

func TestIDsErrors(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	tests := []struct {
		name, idsQuery, want string
	}{
		{"none", "", "no ids_query"},
		{"two columns", "select '1', '2'", "2 columns, want 1"},
		{"null id", "select null::text", "row 1: NULL id"},
		{"sql error", "select id from nowhere", "SQLSTATE 42P01"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := newSource(t, pool, postgres.Config{Keyspace: "ids", Query: "select $1::text[]", IDsQuery: tt.idsQuery})
			err := src.IDs(context.Background(), func(string) error { return nil })
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), `keyspace "ids"`) {
				t.Errorf("IDs: got error %v, want one naming the keyspace and containing %q", err, tt.want)
			}
		})
	}
	src := newSource(t, pool, postgres.Config{Keyspace: "ids", Query: "select 1"})
	if err := src.IDs(context.Background(), func(string) error { return nil }); !errors.Is(err, postgres.ErrNoIDsQuery) {
		t.Errorf("IDs without ids_query: got %v, want ErrNoIDsQuery", err)
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	kv := table(t, pool, "jsonb", nil)
	tests := []struct {
		name, query, idsQuery, want string
	}{
		{"good", "select id, value from " + kv + " where id = any($1::text[])", "select id from " + kv, ""},
		{"no parameter", "select id, value from " + kv, "", "takes 0 parameters"},
		{"int array", "select id, value from " + kv + " where length(id) = any($1)", "", "$1 is _int4, want text[]"},
		{"int value", "select id, 1 from " + kv + " where id = any($1)", "", "type int4"},
		{"one column", "select id from " + kv + " where id = any($1)", "", "returns 1 columns, want 2"},
		{"ids_query parameter", "select id, value from " + kv + " where id = any($1)", "select id from " + kv + " where id = $1", "ids_query: takes 1 parameters"},
		{"ids_query columns", "select id, value from " + kv + " where id = any($1)", "select id, value from " + kv, "ids_query: returns 2 columns"},
		{"missing table", "select id, value from nowhere where id = any($1)", "", "SQLSTATE 42P01"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := newSource(t, pool, postgres.Config{Keyspace: "check", Query: tt.query, IDsQuery: tt.idsQuery})
			err := src.Check(context.Background())
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Check: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Check: got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	tests := []struct {
		name string
		pool *pgxpool.Pool
		cfg  postgres.Config
	}{
		{"nil pool", nil, postgres.Config{Keyspace: "k", Query: "q"}},
		{"no keyspace", pool, postgres.Config{Query: "q"}},
		{"no query", pool, postgres.Config{Keyspace: "k"}},
		{"negative timeout", pool, postgres.Config{Keyspace: "k", Query: "q", StatementTimeout: -time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := postgres.New(tt.pool, tt.cfg); err == nil {
				t.Error("New: got no error, want one")
			}
		})
	}
}

func TestNewPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := postgres.NewPool(ctx, testenv.PostgresURL(), 3, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if got := pool.Config().MaxConns; got != 3 {
		t.Errorf("MaxConns: got %d, want 3", got)
	}
	var app string
	if err := pool.QueryRow(ctx, "select current_setting('application_name')").Scan(&app); err != nil || app != "keepwarm" {
		t.Errorf("application_name: got %q, %v; want keepwarm", app, err)
	}
	for _, dsn := range []string{
		"postgres://u:s3cr3tpw@host:notaport/db",
		"postgres://u:s3cr3tpw@[::1/db",
		"host=h password=s3cr3tpw port=x",
		"host=h password='s3cr3tpw",
	} {
		_, err := postgres.NewPool(ctx, dsn, 0, 0)
		if err == nil {
			t.Errorf("NewPool(%q): got no error, want a parse error", dsn)
			continue
		}
		if strings.Contains(err.Error(), "s3cr3tpw") {
			t.Errorf("NewPool: error %q shows the password", err)
		}
	}
}
