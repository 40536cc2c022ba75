package postgres_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/sources/postgres"
)

// TestPoolBacksOffReconnects: while PostgreSQL is unreachable (the fault proxy in front of it is cut), a pool
// asked for a connection 400 times over at least 2 s dials only a handful of times, with growing pauses, instead
// of once per request; when the server is back, the pool reconnects by itself.
func TestPoolBacksOffReconnects(t *testing.T) {
	t.Parallel()
	testenv.Postgres(t) // fails with how to start PostgreSQL when it is not there
	fp := testenv.Proxy(t, testenv.PostgresAddr(t))
	u, err := url.Parse(testenv.PostgresURL())
	if err != nil {
		t.Fatalf("parse KEEPWARM_POSTGRES_URL: %v", err)
	}
	u.Host = fp.Addr()
	ctx := context.Background()
	pool, err := postgres.NewPool(ctx, u.String(), 4, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("Ping through the proxy: %v", err)
	}

	fp.Cut()
	const pings = 400
	dials, skipped := 0, 0
	start := time.Now()
	for range pings {
		err := pool.Ping(ctx)
		switch {
		case err == nil:
			t.Fatal("Ping succeeded while the proxy is cut")
		case errors.Is(err, postgres.ErrReconnectBackoff):
			skipped++
		default:
			dials++ // a dial that reached the network (or the dead idle connection, once)
		}
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	t.Logf("PostgreSQL down: %d pings in %v made %d connection attempts (%.1f/s), %d waited for the back-off",
		pings, elapsed.Round(time.Millisecond), dials, float64(dials)/elapsed.Seconds(), skipped)
	if dials > 15 {
		t.Errorf("%d connection attempts for %d pings in %v, want at most 15 (one per back-off pause)", dials, pings, elapsed)
	}

	fp.Restore()
	deadline := time.Now().Add(2 * postgres.ReconnectBackoffMax)
	for {
		err := pool.Ping(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reconnect %v after PostgreSQL came back: %v", 2*postgres.ReconnectBackoffMax, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
