package chinook_test

import (
	"context"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/keepwarm/keepwarm/examples/chinook"
	"github.com/keepwarm/keepwarm/internal/testenv"
)

// scratch returns the DSN of a database name that does not exist yet, dropped (if created) on cleanup.
func scratch(t *testing.T) string {
	t.Helper()
	return testenv.UncreatedDatabase(t)
}

func TestLoadOnceAndConcurrently(t *testing.T) {
	dsn := scratch(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	results := make(chan bool, 3)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			loaded, err := chinook.Load(ctx, dsn)
			if err != nil {
				t.Errorf("Load: %v", err)
			}
			results <- loaded
		}()
	}
	wg.Wait()
	close(results)
	n := 0
	for loaded := range results {
		if loaded {
			n++
		}
	}
	if n != 1 {
		t.Errorf("concurrent Load: the catalog was loaded %d times, want once", n)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var tracks, lines int
	if err := conn.QueryRow(ctx, "select (select count(*) from track), (select count(*) from invoice_line)").Scan(&tracks, &lines); err != nil {
		t.Fatal(err)
	}
	if tracks != chinook.Tracks || lines != 2240 {
		t.Errorf("got %d tracks and %d invoice lines, want %d and 2240", tracks, lines, chinook.Tracks)
	}
}

func TestLoadRefusesAForeignTrackTable(t *testing.T) {
	dsn := scratch(t)
	ctx := context.Background()
	admin := testenv.Postgres(t)
	u, _ := url.Parse(dsn)
	if _, err := admin.Exec(ctx, "create database "+pgx.Identifier{strings.TrimPrefix(u.Path, "/")}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "create table track (id int); insert into track values (1)"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if _, err := chinook.Load(ctx, dsn); err == nil || !strings.Contains(err.Error(), "has a track table with 1 rows, not 3503: not touching it") {
		t.Errorf("Load: got %v, want a refusal", err)
	}
}

func TestBody(t *testing.T) {
	body, err := chinook.Body()
	if err != nil {
		t.Fatal(err)
	}
	for _, never := range []string{"DROP DATABASE", "CREATE DATABASE", `\c`} {
		if strings.Contains(body, never) {
			t.Errorf("Body contains %q", never)
		}
	}
}

func TestDSNFor(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://kw@h:1/keepwarm?sslmode=disable": "postgres://kw@h:1/chinook?sslmode=disable",
		"postgresql://h/":        "postgresql://h/chinook",
		"host=h dbname=keepwarm": "host=h dbname=keepwarm dbname=chinook",
	} {
		got, err := chinook.DSNFor(in)
		if err != nil || got != want {
			t.Errorf("DSNFor(%q): got %q, %v; want %q", in, got, err, want)
		}
		if cfg, err := pgx.ParseConfig(got); err != nil {
			t.Errorf("DSNFor(%q) = %q: pgx cannot parse it: %v", in, got, err)
		} else if cfg.Database != "chinook" {
			t.Errorf("DSNFor(%q) = %q: pgx reads database %q, want chinook", in, got, cfg.Database)
		}
	}
}
