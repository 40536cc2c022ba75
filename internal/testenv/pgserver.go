package testenv

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
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

// PG17BinDir returns the directory of the PostgreSQL 17 server binaries that `scripts/services up pg17` fetched:
// $KEEPWARM_PG17_BINDIR, else the one recorded in .run/pg17.bindir at the module's root. It fails the test, saying
// how to fetch them, when there are none.
func PG17BinDir(tb testing.TB) string {
	tb.Helper()
	const how = "PostgreSQL 17's binaries are not here: fetch them with `scripts/services up pg17` (make test does it), or set KEEPWARM_PG17_BINDIR"
	dir := os.Getenv("KEEPWARM_PG17_BINDIR")
	if dir == "" {
		root, err := moduleRoot()
		if err != nil {
			tb.Fatalf("%s (%v)", how, err)
		}
		b, err := os.ReadFile(filepath.Join(root, ".run", "pg17.bindir"))
		if err != nil {
			tb.Fatalf("%s (%v)", how, err)
		}
		dir = strings.TrimSpace(string(b))
	}
	if _, err := os.Stat(filepath.Join(dir, "postgres")); err != nil {
		tb.Fatalf("%s (%v)", how, err)
	}
	return dir
}

// moduleRoot is the directory of the go.mod above the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
