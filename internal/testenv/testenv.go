// Package testenv connects tests to the real Redis and PostgreSQL that scripts/services starts.
//
// Tests never skip when a server is missing: they fail with a message that says how to start it. Each test gets
// its own key prefix (Redis) or schema (PostgreSQL) and cleans it up, so tests can run in parallel.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/redisserver"
)

// Defaults match scripts/services; the environment (`eval "$(scripts/services env)"`) overrides them.
const (
	DefaultRedisURL    = "redis://127.0.0.1:16379/0"
	DefaultPostgresURL = "postgres://keepwarm@127.0.0.1:15432/keepwarm?sslmode=disable"
)

const howToStart = "start the local services with `scripts/services up` (or run `make test`, which does it), " +
	"or point %s at a running server"

// RedisURL is KEEPWARM_REDIS_URL or DefaultRedisURL.
func RedisURL() string { return envOr("KEEPWARM_REDIS_URL", DefaultRedisURL) }

// PostgresURL is KEEPWARM_POSTGRES_URL or DefaultPostgresURL.
func PostgresURL() string { return envOr("KEEPWARM_POSTGRES_URL", DefaultPostgresURL) }

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Redis returns a new client with its own connection pool, standing for one application process. It fails the
// test, saying how to start Redis, when the server does not answer. The client is closed on cleanup.
func Redis(tb testing.TB) *redis.Client {
	tb.Helper()
	opt, err := redis.ParseURL(RedisURL())
	if err != nil {
		tb.Fatalf("parse KEEPWARM_REDIS_URL %q: %v", RedisURL(), err)
	}
	c := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		tb.Fatalf("redis at %s is not reachable (%v): "+howToStart, RedisURL(), err, "KEEPWARM_REDIS_URL")
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Prefix returns a key prefix unique to this test ("kwtest:<name>:<random>:") and deletes every key under it on
// cleanup, so tests that share one Redis never see each other's keys.
func Prefix(tb testing.TB, c redis.UniversalClient) string {
	tb.Helper()
	name := strings.NewReplacer("/", "_", " ", "_", ":", "_").Replace(tb.Name())
	p := "kwtest:" + name + ":" + randHex(4) + ":"
	tb.Cleanup(func() { DeleteContaining(c, p) })
	return p
}

// DeleteContaining deletes every key whose name contains s (a SCAN for *s*), so that it also finds keys whose
// template puts text before a test's prefix (for example "lock:" + p). See redisserver.DeleteContaining; this
// wrapper bounds it by 10 s and ignores its error (it runs in cleanups, where the test has already finished).
func DeleteContaining(c redis.UniversalClient, s string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = redisserver.DeleteContaining(ctx, c, s)
}

// Postgres returns a pool on the test database. It fails the test, saying how to start PostgreSQL, when the
// server does not answer. The pool is closed on cleanup.
func Postgres(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, PostgresURL())
	if err != nil {
		tb.Fatalf("parse KEEPWARM_POSTGRES_URL: %v", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		tb.Fatalf("postgresql at %s is not reachable (%v): "+howToStart, PostgresURL(), err, "KEEPWARM_POSTGRES_URL")
	}
	tb.Cleanup(pool.Close)
	return pool
}

// Schema creates a schema unique to this test and drops it (with everything in it) on cleanup. It returns the
// schema's name, already safe to splice into SQL as an identifier.
func Schema(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	name := "kwtest_" + randHex(6)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "create schema "+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("create schema %s: %v", name, err)
	}
	tb.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "drop schema "+pgx.Identifier{name}.Sanitize()+" cascade"); err != nil {
			tb.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}

// Database creates a throwaway database "kwtest_<12 hex digits>" on the test server, for tests that need a whole
// database of their own (migrations, the demo loader) rather than a Schema. It returns the database's URL: the
// server's URL (KEEPWARM_POSTGRES_URL) with the database name swapped in. The database is dropped, with (force),
// on cleanup. It fails the test when the server is not reachable or the URL is not a postgres:// URL.
func Database(tb testing.TB) string {
	tb.Helper()
	admin := Postgres(tb)
	name, u := newDatabaseName(tb)
	if _, err := admin.Exec(context.Background(), "create database "+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("create database %s: %v", name, err)
	}
	dropOnCleanup(tb, admin, name)
	return u
}

// UncreatedDatabase returns the URL of a database that does not exist yet, named as Database names them, for
// tests of code that creates its own database. The database is dropped on cleanup if it was created.
func UncreatedDatabase(tb testing.TB) string {
	tb.Helper()
	admin := Postgres(tb)
	name, u := newDatabaseName(tb)
	dropOnCleanup(tb, admin, name)
	return u
}

func newDatabaseName(tb testing.TB) (name, dbURL string) {
	tb.Helper()
	u, err := url.Parse(PostgresURL())
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		tb.Fatalf("KEEPWARM_POSTGRES_URL must be a postgres:// URL for a test that needs its own database: %q", PostgresURL())
	}
	name = "kwtest_" + randHex(6)
	u.Path = "/" + name
	return name, u.String()
}

func dropOnCleanup(tb testing.TB, admin *pgxpool.Pool, name string) {
	tb.Cleanup(func() {
		q := "drop database if exists " + pgx.Identifier{name}.Sanitize() + " with (force)"
		if _, err := admin.Exec(context.Background(), q); err != nil {
			tb.Errorf("drop database %s: %v", name, err)
		}
	})
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err)) // programmer/system error: never happens on Linux
	}
	return hex.EncodeToString(b)
}
