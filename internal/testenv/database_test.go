package testenv_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// TestDatabase: Database creates a database of its own that the test can use, and drops it when the test ends;
// UncreatedDatabase names one that does not exist yet and drops it if the test created it.
func TestDatabase(t *testing.T) {
	admin := testenv.Postgres(t)
	ctx := context.Background()
	exists := func(t *testing.T, dbURL string) bool {
		t.Helper()
		u, err := url.Parse(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(u.Path, "/")
		if !strings.HasPrefix(name, "kwtest_") {
			t.Fatalf("database %q: want a kwtest_ name", name)
		}
		var n int
		if err := admin.QueryRow(ctx, "select count(*) from pg_database where datname = $1", name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	tests := []struct {
		name      string
		open      func(testing.TB) string
		createdBy string // "helper", "test"
	}{
		{name: "Database", open: testenv.Database, createdBy: "helper"},
		{name: "UncreatedDatabase", open: testenv.UncreatedDatabase, createdBy: "test"},
	}
	for _, tt := range tests {
		var dbURL string
		t.Run(tt.name, func(t *testing.T) {
			dbURL = tt.open(t)
			if tt.createdBy == "test" {
				if exists(t, dbURL) {
					t.Fatalf("%s: database exists before the test created it", dbURL)
				}
				u, _ := url.Parse(dbURL)
				name := strings.TrimPrefix(u.Path, "/")
				if _, err := admin.Exec(ctx, "create database "+pgx.Identifier{name}.Sanitize()); err != nil {
					t.Fatal(err)
				}
			}
			conn, err := pgx.Connect(ctx, dbURL)
			if err != nil {
				t.Fatalf("connect to %s: %v", dbURL, err)
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, "create table t (id int)"); err != nil {
				t.Errorf("create a table in the throwaway database: %v", err)
			}
		})
		if dbURL == "" {
			continue
		}
		if exists(t, dbURL) {
			t.Errorf("%s: database still exists after the test's cleanup", tt.name)
		}
	}
}
