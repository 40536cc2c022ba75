package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/sources/postgres"
)

// badInput is how the warmer tells a batch that failed on its input from a failing origin (postgres.ErrBadInput
// has the method), without importing this package.
type badInput interface{ BadInput() bool }

func isBadInput(err error) bool {
	var bi badInput
	return errors.As(err, &bi) && bi.BadInput()
}

// TestBadInputInEveryExecMode: in each of pgx's exec modes, a batch that fails on one id comes back as
// a BadInput error, not as a plain origin failure, and the connection is still good for the next batch.
//   - An id with a NUL byte never reaches the server (in simple_protocol mode it cost the connection, 08P01):
//     the source refuses it (ValidID, also offered to the warmer as a method) and Fetch fails with ErrBadInput
//     wrapping ErrInvalidID.
//   - A query that casts ids to int fails on "abc" with 22P02, a data exception: ErrBadInput wrapping the
//     *pgconn.PgError.
func TestBadInputInEveryExecMode(t *testing.T) {
	t.Parallel()
	setup := testenv.Postgres(t)
	kv := table(t, setup, "text", map[string]any{"1": "one", "2": "two"})
	for _, mode := range execModes {
		t.Run(mode, func(t *testing.T) {
			pool := poolInMode(t, mode, "")
			for _, timeout := range []time.Duration{0, 5 * time.Second} { // with and without the transaction
				src := newSource(t, pool, postgres.Config{Keyspace: "bad", StatementTimeout: timeout,
					Query: "select k.id::text, v.value from unnest($1::text[]) as k(id) join " + kv + " v on v.id::int = k.id::int"})
				ctx := context.Background()

				v, ok := any(src).(interface{ ValidID(string) error })
				if !ok {
					t.Fatal("postgres.Source has no ValidID method")
				}
				if err := v.ValidID("1\x002"); err == nil || !strings.Contains(err.Error(), "NUL byte at offset 1") {
					t.Errorf("ValidID(%q): got %v, want an error naming the NUL byte", "1\x002", err)
				}
				if err := v.ValidID("é 'x'"); err != nil {
					t.Errorf("ValidID(%q): %v, want nil", "é 'x'", err)
				}

				_, _, err := src.Fetch(ctx, []string{"1", "2\x00"})
				if !isBadInput(err) || !strings.Contains(err.Error(), "invalid id") {
					t.Errorf("Fetch with a NUL id: got %v, want a BadInput error about the invalid id", err)
				}
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) {
					t.Errorf("Fetch with a NUL id: the server answered %s; the id should never have been sent", pgErr.Code)
				}

				_, _, err = src.Fetch(ctx, []string{"1", "abc"})
				if !isBadInput(err) || !errors.As(err, &pgErr) || pgErr.Code != "22P02" {
					t.Errorf("Fetch with a non-numeric id: got %v, want a BadInput error wrapping SQLSTATE 22P02", err)
				}

				values, missing, err := src.Fetch(ctx, []string{"1", "2", "3"})
				if err != nil || string(values["1"]) != "one" || string(values["2"]) != "two" || len(missing) != 1 {
					t.Errorf("Fetch after the bad batches: got %q, missing %q, %v; want 1 and 2, 3 missing", values, missing, err)
				}
			}
		})
	}
}

// TestOriginErrorsAreNotBadInput: an error of the origin itself (a missing table, 42P01) is not BadInput; only
// the batch's input is blamed for a data exception.
func TestOriginErrorsAreNotBadInput(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	src := newSource(t, pool, postgres.Config{Keyspace: "gone", Query: "select id, id from no_such_table where id = any($1::text[])"})
	_, _, err := src.Fetch(context.Background(), []string{"1"})
	if err == nil || isBadInput(err) {
		t.Errorf("Fetch from a missing table: got %v, want an error that is not BadInput", err)
	}
}
