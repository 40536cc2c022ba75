package testenv

import (
	"context"
	"testing"

	"github.com/keepwarm/keepwarm/internal/pgserver"
)

// PrivatePostgres starts a private PostgreSQL cluster for this test (see pgserver.Start), removed on cleanup. It
// fails the test, saying what to install, when PostgreSQL cannot start. Tests use it when they change server-wide
// settings (synchronous_standby_names), restart, stop or promote the server, or need a standby.
func PrivatePostgres(tb testing.TB, opts pgserver.Options) *pgserver.Server {
	tb.Helper()
	srv, err := pgserver.Start(context.Background(), opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(srv.Remove)
	return srv
}
