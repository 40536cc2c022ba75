package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNoIDsQuery is returned by IDs when the keyspace has no ids_query.
var ErrNoIDsQuery = errors.New("postgres: keyspace has no ids_query")

// Config describes one keyspace's queries. It is the [[keyspace]] section of keepwarm's config, minus Redis.
type Config struct {
	// Keyspace is the keyspace's name, used in every error. Required.
	Keyspace string
	// Query takes $1, the batch of ids as text[], and returns rows (id, value). The id column's text form must
	// equal the requested id (cast it with ::text, or return the requested id itself). The value column must be
	// json, jsonb, text, varchar, char or bytea; its bytes are returned exactly as PostgreSQL stores them (json
	// and jsonb as psql prints them, bytea raw). A NULL value means missing. Required.
	Query string
	// IDsQuery lists ids, one per row in the first and only column, for warmups. Optional.
	IDsQuery string
	// StatementTimeout bounds each Fetch query, on top of the caller's context. 0 means no bound of its own. It
	// does not apply to IDs, which streams for as long as its context allows.
	StatementTimeout time.Duration
}

// Source fetches one keyspace's values from PostgreSQL. It is safe for concurrent use.
type Source struct {
	pool *pgxpool.Pool
	cfg  Config
}

// New returns a Source that runs cfg's queries on pool. It checks cfg but does not touch the database; call
// Check at start-up to verify the queries' shape against the server.
func New(pool *pgxpool.Pool, cfg Config) (*Source, error) {
	switch {
	case pool == nil:
		return nil, errors.New("postgres: nil pool")
	case cfg.Keyspace == "":
		return nil, errors.New("postgres: config has no keyspace name")
	case cfg.Query == "":
		return nil, fmt.Errorf("postgres: keyspace %q: no query", cfg.Keyspace)
	case cfg.StatementTimeout < 0:
		return nil, fmt.Errorf("postgres: keyspace %q: negative statement timeout %s", cfg.Keyspace, cfg.StatementTimeout)
	}
	return &Source{pool: pool, cfg: cfg}, nil
}

// Keyspace returns the keyspace's name.
func (s *Source) Keyspace() string { return s.cfg.Keyspace }

// valueOIDs are the value column types Fetch accepts; all of them are read in binary format, which is the raw
// text for the textual types, a version byte plus the text for jsonb, and the raw bytes for bytea.
var valueOIDs = map[uint32]bool{
	pgtype.TextOID: true, pgtype.VarcharOID: true, pgtype.BPCharOID: true,
	pgtype.JSONOID: true, pgtype.JSONBOID: true, pgtype.ByteaOID: true,
}

// jsonbVersion is the first byte of jsonb's binary format.
const jsonbVersion = 1

// Fetch runs the keyspace's query once for ids, bound as $1 (text[]), and returns the value of each id the query
// returned and the ids it did not return (or returned with a NULL value). Duplicate ids are fetched once. The
// query runs under StatementTimeout; when that passes, the error satisfies errors.Is(err,
// context.DeadlineExceeded). Errors name the keyspace and, for server errors, carry the SQLSTATE
// (*pgconn.PgError). A row whose id was not requested, or that repeats an id, fails the batch: it means the
// query does not honour $1.
func (s *Source) Fetch(ctx context.Context, ids []string) (map[string][]byte, []string, error) {
	uniq := make([]string, 0, len(ids))
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		if !want[id] {
			want[id] = true
			uniq = append(uniq, id)
		}
	}
	values := make(map[string][]byte, len(uniq))
	if len(uniq) == 0 {
		return values, []string{}, nil
	}

	qctx, cancel := s.queryContext(ctx)
	defer cancel()
	rows, err := s.pool.Query(qctx, s.cfg.Query,
		pgx.QueryResultFormats{pgx.TextFormatCode, pgx.BinaryFormatCode}, uniq)
	if err != nil {
		return nil, nil, s.wrap(ctx, qctx, "query", err)
	}
	defer rows.Close()

	fds := rows.FieldDescriptions()
	if fds == nil { // pgx reports most query errors on the first Next, not from Query
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, nil, s.wrap(ctx, qctx, "query", err)
		}
	}
	if len(fds) != 2 {
		return nil, nil, fmt.Errorf("keyspace %q: query: returns %d columns, want 2 (id, value)", s.cfg.Keyspace, len(fds))
	}
	valueOID := fds[1].DataTypeOID
	if !valueOIDs[valueOID] {
		return nil, nil, fmt.Errorf("keyspace %q: query: value column %q has type %s; cast it to json, jsonb, text or bytea",
			s.cfg.Keyspace, fds[1].Name, s.typeName(valueOID))
	}
	seen := make(map[string]bool, len(uniq))
	for rows.Next() {
		raw := rows.RawValues()
		if raw[0] == nil {
			return nil, nil, fmt.Errorf("keyspace %q: query: returned a NULL id", s.cfg.Keyspace)
		}
		id := string(raw[0])
		if !want[id] {
			return nil, nil, fmt.Errorf("keyspace %q: query: returned id %q, which was not requested; does it filter on $1?", s.cfg.Keyspace, id)
		}
		if seen[id] {
			return nil, nil, fmt.Errorf("keyspace %q: query: returned id %q twice", s.cfg.Keyspace, id)
		}
		seen[id] = true
		v := raw[1]
		if v == nil {
			continue // NULL value: missing
		}
		if valueOID == pgtype.JSONBOID {
			if len(v) == 0 || v[0] != jsonbVersion {
				return nil, nil, fmt.Errorf("keyspace %q: query: jsonb value of id %q has an unknown binary version", s.cfg.Keyspace, id)
			}
			v = v[1:]
		}
		values[id] = append(make([]byte, 0, len(v)), v...) // RawValues are only valid until the next row
	}
	if err := rows.Err(); err != nil {
		return nil, nil, s.wrap(ctx, qctx, "query", err)
	}
	missing := make([]string, 0, len(uniq)-len(values))
	for _, id := range uniq {
		if _, ok := values[id]; !ok {
			missing = append(missing, id)
		}
	}
	return values, missing, nil
}

// IDs streams the rows of ids_query, calling fn with each id in the query's order; it stops at fn's first
// error and returns it. Rows are read as they arrive and never buffered, so a warmup over millions of ids holds
// one row at a time (and one pool connection for the whole stream). StatementTimeout does not apply: the
// caller's ctx is the only bound. It returns ErrNoIDsQuery when the keyspace has none.
func (s *Source) IDs(ctx context.Context, fn func(id string) error) error {
	if s.cfg.IDsQuery == "" {
		return fmt.Errorf("keyspace %q: %w", s.cfg.Keyspace, ErrNoIDsQuery)
	}
	// Stopping early must cancel the query on the server; otherwise closing the rows would read the rest.
	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rows, err := s.pool.Query(qctx, s.cfg.IDsQuery, pgx.QueryResultFormats{pgx.TextFormatCode})
	if err != nil {
		return s.wrap(ctx, qctx, "ids_query", err)
	}
	defer rows.Close()
	if rows.FieldDescriptions() == nil {
		rows.Close()
		if err := rows.Err(); err != nil {
			return s.wrap(ctx, qctx, "ids_query", err)
		}
	}
	if n := len(rows.FieldDescriptions()); n != 1 {
		return fmt.Errorf("keyspace %q: ids_query: returns %d columns, want 1 (id)", s.cfg.Keyspace, n)
	}
	row := 0
	for rows.Next() {
		row++
		raw := rows.RawValues()
		if raw[0] == nil {
			return fmt.Errorf("keyspace %q: ids_query: row %d: NULL id", s.cfg.Keyspace, row)
		}
		if err := fn(string(raw[0])); err != nil {
			cancel()
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return s.wrap(ctx, qctx, "ids_query", err)
	}
	return nil
}

// Ping checks that PostgreSQL answers.
func (s *Source) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("keyspace %q: ping: %w", s.cfg.Keyspace, err)
	}
	return nil
}

// Check asks the server to prepare the keyspace's queries without running them, and reports a query that does
// not parse, does not take exactly one text[] parameter, or returns the wrong columns. Call it at start-up.
func (s *Source) Check(ctx context.Context) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("keyspace %q: check: %w", s.cfg.Keyspace, err)
	}
	defer conn.Release()
	sd, err := conn.Conn().Prepare(ctx, "", s.cfg.Query)
	if err != nil {
		return fmt.Errorf("keyspace %q: query: %w", s.cfg.Keyspace, err)
	}
	switch {
	case len(sd.ParamOIDs) != 1:
		return fmt.Errorf("keyspace %q: query: takes %d parameters, want 1 ($1, the ids as text[])", s.cfg.Keyspace, len(sd.ParamOIDs))
	case sd.ParamOIDs[0] != pgtype.TextArrayOID && sd.ParamOIDs[0] != pgtype.VarcharArrayOID:
		return fmt.Errorf("keyspace %q: query: $1 is %s, want text[]: write $1::text[]", s.cfg.Keyspace, s.typeName(sd.ParamOIDs[0]))
	case len(sd.Fields) != 2:
		return fmt.Errorf("keyspace %q: query: returns %d columns, want 2 (id, value)", s.cfg.Keyspace, len(sd.Fields))
	case !valueOIDs[sd.Fields[1].DataTypeOID]:
		return fmt.Errorf("keyspace %q: query: value column %q has type %s; cast it to json, jsonb, text or bytea",
			s.cfg.Keyspace, sd.Fields[1].Name, s.typeName(sd.Fields[1].DataTypeOID))
	}
	if s.cfg.IDsQuery == "" {
		return nil
	}
	sd, err = conn.Conn().Prepare(ctx, "", s.cfg.IDsQuery)
	if err != nil {
		return fmt.Errorf("keyspace %q: ids_query: %w", s.cfg.Keyspace, err)
	}
	switch {
	case len(sd.ParamOIDs) != 0:
		return fmt.Errorf("keyspace %q: ids_query: takes %d parameters, want none", s.cfg.Keyspace, len(sd.ParamOIDs))
	case len(sd.Fields) != 1:
		return fmt.Errorf("keyspace %q: ids_query: returns %d columns, want 1 (id)", s.cfg.Keyspace, len(sd.Fields))
	}
	return nil
}

func (s *Source) queryContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.cfg.StatementTimeout > 0 {
		return context.WithTimeout(ctx, s.cfg.StatementTimeout)
	}
	return context.WithCancel(ctx)
}

// sqlstateQueryCanceled is PostgreSQL's query_canceled: a cancel request or the server's own statement_timeout.
const sqlstateQueryCanceled = "57014"

// wrap names the keyspace and keeps cancellation visible: when the caller's ctx ended, the error wraps its
// Err(); when only StatementTimeout passed, or the server's own statement_timeout cancelled the query, it wraps
// context.DeadlineExceeded and says "timeout". pgx reports a cancelled query as SQLSTATE 57014 or as a
// context error depending on timing; either way the original error stays wrapped too.
func (s *Source) wrap(ctx, qctx context.Context, op string, err error) error {
	var pgErr *pgconn.PgError
	serverTimeout := errors.As(err, &pgErr) && pgErr.Code == sqlstateQueryCanceled &&
		strings.Contains(pgErr.Message, "statement timeout")
	switch {
	case ctx.Err() != nil:
		if errors.Is(err, ctx.Err()) {
			return fmt.Errorf("keyspace %q: %s: %w", s.cfg.Keyspace, op, err)
		}
		return fmt.Errorf("keyspace %q: %s: %w: %w", s.cfg.Keyspace, op, ctx.Err(), err)
	case errors.Is(qctx.Err(), context.DeadlineExceeded):
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("keyspace %q: %s: timeout after %s: %w", s.cfg.Keyspace, op, s.cfg.StatementTimeout, err)
		}
		return fmt.Errorf("keyspace %q: %s: timeout after %s: %w: %w", s.cfg.Keyspace, op, s.cfg.StatementTimeout, context.DeadlineExceeded, err)
	case serverTimeout:
		return fmt.Errorf("keyspace %q: %s: timeout (server statement_timeout): %w: %w", s.cfg.Keyspace, op, context.DeadlineExceeded, err)
	}
	return fmt.Errorf("keyspace %q: %s: %w", s.cfg.Keyspace, op, err)
}

func (s *Source) typeName(oid uint32) string {
	if t, ok := pgtype.NewMap().TypeForOID(oid); ok {
		return t.Name
	}
	return fmt.Sprintf("oid %d", oid)
}
