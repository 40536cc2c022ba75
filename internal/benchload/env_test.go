package benchload_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keepwarm/keepwarm/internal/benchload"
	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/sources/postgres"
)

// TestLoaderOf: the Source→Loader adapter that the load, replay and stampede benchmarks share returns a found
// id's bytes and lockstep.ErrNotFound for an id the origin lacks, against the real PostgreSQL.
func TestLoaderOf(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	table := pgx.Identifier{testenv.Schema(t, pool), "items"}.Sanitize()
	if _, err := pool.Exec(ctx, "create table "+table+" (id text primary key, v text); insert into "+table+" values ('1', 'one')"); err != nil {
		t.Fatal(err)
	}
	src, err := postgres.New(pool, postgres.Config{Keyspace: "items",
		Query: "select id, v from " + table + " where id = any($1)", StatementTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	load := benchload.LoaderOf(src)
	tests := []struct {
		id      string
		want    string
		wantErr error
	}{
		{id: "1", want: "one"},
		{id: "2", wantErr: lockstep.ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			got, err := load(ctx, tt.id)
			if string(got) != tt.want || !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Errorf("load(%q) = %q, %v; want %q, %v", tt.id, got, err, tt.want, tt.wantErr)
			}
		})
	}
}
