package stream_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/sources/postgres/stream"
)

// TestCheckStreamIgnoresPgxSettings: a [postgres] dsn carrying pgx's own settings (default_query_exec_mode=exec,
// the PgBouncer advice; pool_max_conns) is usable by the change stream's connections, which used to send them to
// the server as run-time parameters ("unrecognized configuration parameter"). A slot or publication that does
// not exist yet is fine with CreatePublication; a publication missing without it is named.
func TestCheckStreamIgnoresPgxSettings(t *testing.T) {
	t.Parallel()
	testenv.Postgres(t) // fails with a how-to-start message when PostgreSQL is down
	dsn := testenv.PostgresURL()
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	dsn += sep + "default_query_exec_mode=exec&pool_max_conns=3&statement_cache_capacity=0"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := "kwcheckstream_none"
	cfg := stream.Config{DSN: dsn, Slot: name, Publication: name, Tables: []string{"public.items"},
		CreatePublication: true, ConnectTimeout: 5 * time.Second}
	if err := stream.Check(ctx, cfg); err != nil {
		t.Fatalf("CheckStream with pgx settings in the dsn: %v", err)
	}
	cfg.CreatePublication = false
	err := stream.Check(ctx, cfg)
	if want := `publication "` + name + `" does not exist and [changes] create_publication is false`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("CheckStream without the publication: got %v, want %q", err, want)
	}
}
