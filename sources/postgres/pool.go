package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keepwarm/keepwarm/sources/postgres/internal/pgdsn"
)

// NewPool returns a connection pool for dsn (a postgres:// URL or keyword/value string; TLS comes from its
// sslmode, sslrootcert, sslcert and sslkey). maxConns > 0 caps the pool (pgxpool's default is the larger of 4
// and the number of CPUs); connectTimeout > 0 bounds each connection attempt. It sets application_name to
// "keepwarm" unless the dsn sets one. While PostgreSQL is down, the pool dials each address at most once per
// jittered back-off pause (ReconnectBackoffBase doubling up to ReconnectBackoffMax); other connection attempts
// fail at once with an error wrapping ErrReconnectBackoff. It does not connect: use Ping. Parse errors never contain the password.
func NewPool(ctx context.Context, dsn string, maxConns int32, connectTimeout time.Duration) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: parse dsn: %w", pgdsn.Scrub(err))
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	if connectTimeout > 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	// While the server is down, dial each address at most once per jittered back-off pause (see dialBackoff).
	cfg.ConnConfig.DialFunc = newDialBackoff(cfg.ConnConfig.DialFunc).DialContext
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "keepwarm"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: new pool: %w", err)
	}
	return pool, nil
}

// ParseDSN checks that dsn parses, without connecting. The error never contains the password.
func ParseDSN(dsn string) error {
	if _, err := pgxpool.ParseConfig(dsn); err != nil {
		return pgdsn.Scrub(err)
	}
	return nil
}

// statementCacheProbe is the statement CheckStatementCache prepares. It takes a parameter so that pgx sends it
// in the DSN's default_query_exec_mode (pgx uses the simple protocol for statements without arguments).
const statementCacheProbe = "select $1::int as keepwarm_statement_cache_probe"

// CheckStatementCache tells whether pgx's prepared-statement cache survives between pool and server: it runs a
// probe statement on two of pool's connections in turn, twice, in the DSN's default_query_exec_mode. Behind a
// pooler in transaction mode that does not track prepared statements (PgBouncer before 1.21, or with
// max_prepared_statements = 0), consecutive transactions of different clients land on the same idle server
// connection, and the second client's cached statement collides with the first's (SQLSTATE 42P05, or 26000):
// it then returns an error that wraps the *pgconn.PgError and ends with PgBouncerHint. Directly on PostgreSQL, or
// with default_query_exec_mode=exec or simple_protocol, it returns nil. A nil result is not proof: a pooler
// that hands out server connections round-robin may collide only under load. It needs MaxConns >= 2 and returns
// an error otherwise.
func CheckStatementCache(ctx context.Context, pool *pgxpool.Pool) error {
	if n := pool.Config().MaxConns; n < 2 {
		return fmt.Errorf("postgres: check statement cache: needs a pool of 2 connections, got %d", n)
	}
	c1, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("postgres: check statement cache: %w", err)
	}
	defer c1.Release()
	c2, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("postgres: check statement cache: %w", err)
	}
	defer c2.Release()
	for range 2 {
		for _, c := range []*pgxpool.Conn{c1, c2} {
			if _, err := c.Exec(ctx, statementCacheProbe, 1); err != nil {
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) && (pgErr.Code == sqlstateDuplicatePrepared || pgErr.Code == sqlstateInvalidStatement) {
					return fmt.Errorf("postgres: check statement cache: %w; %s", err, PgBouncerHint)
				}
				return fmt.Errorf("postgres: check statement cache: %w", err)
			}
		}
	}
	return nil
}
