package postgres_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/sources/postgres"
)

// execModes are the five values of pgx's default_query_exec_mode DSN setting. Behind PgBouncer (or by choice)
// the last two return every column in text format, the others in the format asked for.
var execModes = []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"}

// poolInMode returns a pool on the test database whose DSN sets default_query_exec_mode=mode, plus extra DSN
// settings ("&bytea_output=escape").
func poolInMode(t *testing.T, mode, extra string) *pgxpool.Pool {
	t.Helper()
	testenv.Postgres(t) // fails with a how-to-start message when PostgreSQL is down
	pool, err := postgres.NewPool(context.Background(), withParam(testenv.PostgresURL(), "default_query_exec_mode="+mode+extra), 4, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func withParam(url, kv string) string {
	if bytes.ContainsRune([]byte(url), '?') {
		return url + "&" + kv
	}
	return url + "?" + kv
}

// TestValuesInEveryExecMode writes known bytes through each value type and reads them back with Fetch in each of
// pgx's five query exec modes: the bytes must be the same in all of them (jsonb can fail with "unknown binary
// version", and bytea come back as its hex text, in exec and simple_protocol modes).
func TestValuesInEveryExecMode(t *testing.T) {
	t.Parallel()
	setup := testenv.Postgres(t)
	odd := string([]byte{0x00, 0xff, ' ', 'a', 'b'}) // the bytea value: NUL, not UTF-8
	types := []struct {
		typ  string
		in   any    // what is stored
		want string // what Fetch must return: the server's text form, or the raw bytes for bytea
	}{
		{"text", "plain, é, \\x00 'quoted' \"dq\"", "plain, é, \\x00 'quoted' \"dq\""},
		{"varchar(40)", "varchar \\ back\\slash", "varchar \\ back\\slash"},
		{"json", `{"b" : 1,   "a":[1, "\\u00e9"]}`, `{"b" : 1,   "a":[1, "\\u00e9"]}`},
		{"jsonb", `{"b" : 1,   "a":[1, "é"]}`, `{"a": [1, "é"], "b": 1}`},
		{"bytea", []byte(odd), odd},
		{"bytea", []byte(`\x00ff6162`), `\x00ff6162`}, // bytes that look like hex text stay themselves
		{"bytea", []byte{}, ""},
	}
	kvs := make([]string, len(types))
	for i, tt := range types {
		kvs[i] = table(t, setup, tt.typ, map[string]any{"k": tt.in, "null": nil})
	}
	for _, mode := range execModes {
		for _, extra := range []string{"", "&bytea_output=escape"} {
			pool := poolInMode(t, mode, extra)
			for i, tt := range types {
				t.Run(fmt.Sprintf("%s%s/%s/%d", mode, extra, tt.typ, i), func(t *testing.T) {
					for _, timeout := range []time.Duration{0, 5 * time.Second} { // with and without the transaction
						src := newSource(t, pool, postgres.Config{Keyspace: "modes",
							Query: "select id, value from " + kvs[i] + " where id = any($1::text[])", StatementTimeout: timeout})
						values, missing, err := src.Fetch(context.Background(), []string{"k", "null", "absent"})
						if err != nil {
							t.Fatalf("Fetch: %v", err)
						}
						if got, ok := values["k"]; !ok || !bytes.Equal(got, []byte(tt.want)) {
							t.Errorf("Fetch(k): got %q (present %v), want %q", got, ok, tt.want)
						}
						if len(values) != 1 || len(missing) != 2 {
							t.Errorf("Fetch: got values %q, missing %q; want only k present, null and absent missing", values, missing)
						}
					}
				})
			}
		}
	}
}

// TestOddIDsInEveryExecMode fetches odd ids in every exec mode: ids are bound as
// text[] in the extended modes and spliced as a quoted literal by pgx in simple_protocol mode.
func TestOddIDsInEveryExecMode(t *testing.T) {
	t.Parallel()
	setup := testenv.Postgres(t)
	ids := []string{"1", "a'b", `back\slash`, "quote\"d", "{brace}", "comma,id", "NULL", "", " spaced ", "é", "x\ny"}
	rows := map[string]any{}
	for _, id := range ids {
		rows[id] = "v:" + id
	}
	kv := table(t, setup, "text", rows)
	for _, mode := range execModes {
		t.Run(mode, func(t *testing.T) {
			src := newSource(t, poolInMode(t, mode, ""), postgres.Config{Keyspace: "odd",
				Query: "select id, value from " + kv + " where id = any($1::text[])", StatementTimeout: 5 * time.Second})
			values, missing, err := src.Fetch(context.Background(), ids)
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			for _, id := range ids {
				if got := string(values[id]); got != "v:"+id {
					t.Errorf("Fetch(%q): got %q, want %q", id, got, "v:"+id)
				}
			}
			if len(missing) != 0 {
				t.Errorf("Fetch: missing %q, want none", missing)
			}
		})
	}
}
