package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// ErrNoIDsQuery is returned by IDs when the keyspace has no ids_query.
var ErrNoIDsQuery = errors.New("postgres: keyspace has no ids_query")

// ErrPoolExhausted is wrapped by Fetch's error when every pool connection stayed busy for PoolWaitTimeout. The
// message says "pool exhausted (max_conns N)". It does not wrap context.DeadlineExceeded: the query never ran.
// It has a method PoolExhausted() bool (true), by which the warmer tells it from an origin failure without
// importing this package.
var ErrPoolExhausted error = poolExhaustedError{}

type poolExhaustedError struct{}

func (poolExhaustedError) Error() string       { return "postgres: pool exhausted" }
func (poolExhaustedError) PoolExhausted() bool { return true }

// ErrBadInput is wrapped by Fetch's error when the batch failed on its input rather than on the origin: the server
// raised a data exception (SQLSTATE class 22, e.g. 22P02 invalid_text_representation from an id cast to int,
// 22021 from a byte the database encoding cannot hold), or an id is one ValidID refuses (then no query ran). The
// error also wraps the *pgconn.PgError or ErrInvalidID. Some id of the batch, or its row, cannot be processed
// while PostgreSQL itself is healthy: the warmer splits such a batch to find that id and writes the others,
// instead of treating the keyspace's origin as failing. It has a method BadInput() bool (true), by which the
// warmer tells it apart without importing this package.
var ErrBadInput error = badInputError{}

type badInputError struct{}

func (badInputError) Error() string  { return "postgres: bad input" }
func (badInputError) BadInput() bool { return true }

// ErrInvalidID is wrapped by ValidID's errors: an id that PostgreSQL text cannot hold.
var ErrInvalidID = errors.New("postgres: invalid id")

// ValidID reports whether id can be bound as an element of $1 (text[]): it returns an error wrapping ErrInvalidID
// when id holds a NUL byte, which no PostgreSQL text value can hold (the server answers 22021 "invalid byte
// sequence for encoding UTF8: 0x00", or, in simple_protocol mode, 08P01 and a closed connection), or is not valid
// UTF-8 (pgx always speaks client_encoding UTF8). The error names the byte offset. Other limits of the server's
// encoding (a character a LATIN1 database cannot store: 22P05) are not known here; Fetch reports them as
// ErrBadInput.
func ValidID(id string) error {
	if i := strings.IndexByte(id, 0); i >= 0 {
		return fmt.Errorf("%w: %q has a NUL byte at offset %d, which PostgreSQL text cannot hold", ErrInvalidID, truncateID(id), i)
	}
	if !utf8.ValidString(id) {
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrInvalidID, truncateID(id))
	}
	return nil
}

// truncateID shortens an id for an error message: a prefix is enough to find it, and quoting shows every byte.
func truncateID(id string) string {
	if len(id) > 64 {
		return id[:64] + "..."
	}
	return id
}

// Defaults and bounds of Config.
const (
	// DefaultPoolWaitTimeout is Config.PoolWaitTimeout's default.
	DefaultPoolWaitTimeout = time.Second
	// MaxPoolWaitTimeout is the largest Config.PoolWaitTimeout: a wait longer than this means the pool is far too
	// small for the load, and the lead would have to be as long.
	MaxPoolWaitTimeout = time.Minute
	// MinPoolWaitTimeout is the smallest Config.PoolWaitTimeout other than 0: a busy pool hands a connection over
	// in about that long, so a shorter wait fails nearly every fetch as pool exhausted (1ns makes a daemon that
	// is ready and refreshes nothing).
	MinPoolWaitTimeout = 10 * time.Millisecond
	// ClientTimeoutMargin is how much longer than StatementTimeout the client-side backstop waits before pgx
	// cancels the query itself (which costs the connection). The server's statement_timeout should fire first.
	ClientTimeoutMargin = 500 * time.Millisecond
)

// Config describes one keyspace's queries. It is the [[keyspace]] section of keepwarm's config, minus Redis.
type Config struct {
	// Keyspace is the keyspace's name, used in every error. Required.
	Keyspace string
	// Query takes $1, the batch of ids as text[], and returns rows (id, value). The id column's text form must
	// equal the requested id (cast it with ::text, or return the requested id itself). The value column must be
	// json, jsonb, text, varchar, char or bytea; its bytes are returned exactly as PostgreSQL stores them (json
	// and jsonb as psql prints them, bytea raw), whichever pgx default_query_exec_mode the DSN sets. A NULL
	// value means missing. Required.
	Query string
	// IDsQuery lists ids, one per row in the first and only column, for warmups. Optional.
	IDsQuery string
	// StatementTimeout bounds each Fetch query on the server: Fetch runs the query in a transaction with
	// SET LOCAL statement_timeout, so that a slow query is cancelled by PostgreSQL and the connection survives
	// (this also works through PgBouncer in transaction mode). When the caller's context has a deadline that
	// comes first, the server timeout is shortened to end shortly before it (ClientTimeoutMargin, or a fifth of
	// the time left if less). A client-side backstop
	// cancels at StatementTimeout + ClientTimeoutMargin, in case the server does not answer. 0 means no bound of
	// its own (and no transaction unless the context has a deadline). It does not apply to IDs, which streams
	// for as long as its context allows.
	StatementTimeout time.Duration
	// PoolWaitTimeout bounds how long Fetch waits for a free pool connection before it fails with
	// ErrPoolExhausted; it is separate from StatementTimeout, so a query's worst case is PoolWaitTimeout +
	// StatementTimeout. 0 means DefaultPoolWaitTimeout (1s); otherwise it must be in [MinPoolWaitTimeout,
	// MaxPoolWaitTimeout] (10ms to 1m).
	PoolWaitTimeout time.Duration
}

// Option configures a Source.
type Option func(*options)

type options struct {
	reg prometheus.Registerer
}

// WithRegisterer registers the source's metrics on reg: keepwarm_origin_pool_wait_seconds{keyspace}, a
// histogram of pool acquire waits. Several Sources may share one reg. Without it, nothing is registered.
func WithRegisterer(reg prometheus.Registerer) Option { return func(o *options) { o.reg = reg } }

// Source fetches one keyspace's values from PostgreSQL. It is safe for concurrent use.
type Source struct {
	pool    *pgxpool.Pool
	cfg     Config
	metrics *metrics // nil without WithRegisterer
}

// New returns a Source that runs cfg's queries on pool. It checks cfg but does not touch the database; call
// Check at start-up to verify the queries' shape against the server. Errors name the keyspace and the field.
func New(pool *pgxpool.Pool, cfg Config, opts ...Option) (*Source, error) {
	switch {
	case pool == nil:
		return nil, errors.New("postgres: nil pool")
	case cfg.Keyspace == "":
		return nil, errors.New("postgres: config has no keyspace name")
	case cfg.Query == "":
		return nil, fmt.Errorf("postgres: keyspace %q: no query", cfg.Keyspace)
	case cfg.StatementTimeout < 0:
		return nil, fmt.Errorf("postgres: keyspace %q: negative statement timeout %s", cfg.Keyspace, cfg.StatementTimeout)
	case cfg.PoolWaitTimeout < 0 || (cfg.PoolWaitTimeout > 0 && cfg.PoolWaitTimeout < MinPoolWaitTimeout) ||
		cfg.PoolWaitTimeout > MaxPoolWaitTimeout:
		return nil, fmt.Errorf("postgres: keyspace %q: pool wait timeout %s is not 0 (the default) or in [%s, %s]",
			cfg.Keyspace, cfg.PoolWaitTimeout, MinPoolWaitTimeout, MaxPoolWaitTimeout)
	}
	if cfg.PoolWaitTimeout == 0 {
		cfg.PoolWaitTimeout = DefaultPoolWaitTimeout
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	s := &Source{pool: pool, cfg: cfg}
	if o.reg != nil {
		m, err := newMetrics(o.reg)
		if err != nil {
			return nil, fmt.Errorf("postgres: keyspace %q: register metrics: %w", cfg.Keyspace, err)
		}
		s.metrics = m
	}
	return s, nil
}

// Keyspace returns the keyspace's name.
func (s *Source) Keyspace() string { return s.cfg.Keyspace }

// ValidID is the package's ValidID: it returns an error wrapping ErrInvalidID for an id this source can never
// query (a NUL byte, invalid UTF-8). The warmer asks it at every door an id comes in by (warmer.IDValidator), so
// that such an id is skipped and counted there instead of failing a batch.
func (s *Source) ValidID(id string) error { return ValidID(id) }

// Fetch runs the keyspace's query once for ids, bound as $1 (text[]), following the Source contract of package
// sources: the value of each id the query returned, and the ids it did not return (or returned NULL for).
//
// It waits at most PoolWaitTimeout for a pool connection, then fails with an error wrapping ErrPoolExhausted
// that says "pool exhausted (max_conns N)". The query runs under StatementTimeout, enforced by the server (see
// Config.StatementTimeout); when that passes, the error satisfies errors.Is(err, context.DeadlineExceeded) and
// says "timeout". Errors name the keyspace and, for server errors, carry the SQLSTATE (*pgconn.PgError); for
// 42P05 and 26000 (prepared statements lost behind a transaction-pooling PgBouncer) the message says what to set
// in the DSN. A row whose id was not requested, or that repeats an id, fails the batch: it means the query does
// not honour $1.
//
// A batch that fails on its input, not on the origin, returns an error wrapping ErrBadInput: a data exception
// (SQLSTATE class 22) from the server, or an id that ValidID refuses, which is never sent (in simple_protocol mode
// a NUL byte would otherwise cost the connection, 08P01). Splitting the batch isolates the id at fault.
func (s *Source) Fetch(ctx context.Context, ids []string) (map[string][]byte, []string, error) {
	uniq := make([]string, 0, len(ids))
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		if !want[id] {
			want[id] = true
			uniq = append(uniq, id)
		}
	}
	if len(uniq) == 0 {
		return map[string][]byte{}, []string{}, nil
	}
	for _, id := range uniq {
		if err := ValidID(id); err != nil {
			return nil, nil, fmt.Errorf("keyspace %q: query: %w: %w", s.cfg.Keyspace, ErrBadInput, err)
		}
	}

	conn, err := s.acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Release()
	timeout := s.serverTimeout(ctx)
	qctx, cancel := s.queryContext(ctx)
	defer cancel()
	if timeout == 0 {
		return s.read(ctx, qctx, conn, uniq, want)
	}
	// Milliseconds, rounded up so that a sub-millisecond timeout is not 0 (which would mean none).
	ms := (timeout + time.Millisecond - 1) / time.Millisecond
	tx, err := conn.BeginTx(qctx, pgx.TxOptions{BeginQuery: fmt.Sprintf("begin; set local statement_timeout = %d", ms)})
	if err != nil {
		return nil, nil, s.wrap(ctx, qctx, "query: begin", err)
	}
	defer rollback(ctx, tx) // a no-op after Commit
	values, missing, err := s.read(ctx, qctx, tx, uniq, want)
	if err != nil {
		return nil, nil, err
	}
	if err := tx.Commit(qctx); err != nil {
		return nil, nil, s.wrap(ctx, qctx, "query: commit", err)
	}
	return values, missing, nil
}

// querier is a pool connection or a transaction on one.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// read runs the query on q and decodes its rows.
func (s *Source) read(ctx, qctx context.Context, q querier, uniq []string, want map[string]bool) (map[string][]byte, []string, error) {
	// The id column is asked for in text format, the value in binary; the server may answer in text anyway
	// (exec and simple_protocol modes), so decodeValue looks at the format each column really came in.
	rows, err := q.Query(qctx, s.cfg.Query, pgx.QueryResultFormats{pgx.TextFormatCode, pgx.BinaryFormatCode}, uniq)
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
	if fds[0].Format != pgx.TextFormatCode {
		return nil, nil, fmt.Errorf("keyspace %q: query: id column %q came in binary format; cast it to text", s.cfg.Keyspace, fds[0].Name)
	}
	values := make(map[string][]byte, len(uniq))
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
		if raw[1] == nil {
			continue // NULL value: missing
		}
		v, err := decodeValue(valueOID, fds[1].Format, raw[1])
		if err != nil {
			return nil, nil, fmt.Errorf("keyspace %q: query: value of id %q: %w", s.cfg.Keyspace, id, err)
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

// rollbackTimeout bounds the rollback of a failed Fetch's transaction. pgx closes the connection when a rollback
// fails, which is what a server that does not answer deserves.
const rollbackTimeout = 5 * time.Second

// rollback ends tx if it is still open, on a context that outlives the query's (a rollback cut short would cost
// the connection that the server-side timeout saved).
func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = tx.Rollback(rctx) // ErrTxClosed after Commit; otherwise pgx has already closed the broken connection
}

// acquire waits at most PoolWaitTimeout for a pool connection and records the wait.
func (s *Source) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, s.cfg.PoolWaitTimeout)
	defer cancel()
	start := time.Now()
	conn, err := s.pool.Acquire(actx)
	if s.metrics != nil {
		s.metrics.poolWait.WithLabelValues(s.cfg.Keyspace).Observe(time.Since(start).Seconds())
	}
	switch {
	case err == nil:
		return conn, nil
	case ctx.Err() != nil:
		return nil, s.wrap(ctx, actx, "query: wait for a pool connection", err)
	case !errors.Is(actx.Err(), context.DeadlineExceeded):
		return nil, s.wrap(ctx, actx, "query: connect", err) // connecting failed
	}
	st := s.pool.Stat()
	if st.AcquiredConns() < st.MaxConns() {
		// The pool had room: the wait was for a new connection to PostgreSQL, not for a busy one.
		return nil, fmt.Errorf("keyspace %q: query: connect: no new connection within pool_wait_timeout %s (%d of max_conns %d in use)",
			s.cfg.Keyspace, s.cfg.PoolWaitTimeout, st.AcquiredConns(), st.MaxConns())
	}
	return nil, fmt.Errorf("keyspace %q: query: %w (max_conns %d): every connection stayed busy for pool_wait_timeout %s",
		s.cfg.Keyspace, ErrPoolExhausted, st.MaxConns(), s.cfg.PoolWaitTimeout)
}

// IDs streams the rows of ids_query, calling fn with each id in the query's order; it stops at fn's first
// error and returns it. Rows are read as they arrive and never buffered, so a warmup over millions of ids holds
// one row at a time. The stream runs on a connection of its own, opened from the pool's config and closed at the
// end, never on a pool connection: fn usually calls Fetch, and with max_conns = 1 a stream holding the pool's
// only connection would starve it. So a warmup uses up to max_conns + 1 connections. StatementTimeout does not
// apply: the caller's ctx is the only bound. It returns ErrNoIDsQuery when the keyspace has none.
func (s *Source) IDs(ctx context.Context, fn func(id string) error) error {
	if s.cfg.IDsQuery == "" {
		return fmt.Errorf("keyspace %q: %w", s.cfg.Keyspace, ErrNoIDsQuery)
	}
	// Stopping early must cancel the query on the server; otherwise closing the rows would read the rest.
	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conn, err := pgx.ConnectConfig(qctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return s.wrap(ctx, qctx, "ids_query: connect", err)
	}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer ccancel()
		_ = conn.Close(cctx)
	}()
	rows, err := conn.Query(qctx, s.cfg.IDsQuery, pgx.QueryResultFormats{pgx.TextFormatCode})
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

// serverTimeout is the statement_timeout Fetch sets on the server: StatementTimeout, or less when ctx's deadline
// comes first, so that PostgreSQL cancels the query before the caller's context would (and with it pgx, which
// closes the connection): ClientTimeoutMargin before the deadline, or a fifth of the time left when that is
// shorter. 0 means none.
func (s *Source) serverTimeout(ctx context.Context) time.Duration {
	t := s.cfg.StatementTimeout
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		left = max(left-min(ClientTimeoutMargin, left/5), time.Millisecond)
		if t == 0 || left < t {
			t = left
		}
	}
	return t
}

// queryContext is the client-side backstop: StatementTimeout plus ClientTimeoutMargin, so that the server's
// statement_timeout fires first and the connection survives.
func (s *Source) queryContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.cfg.StatementTimeout > 0 {
		return context.WithTimeout(ctx, s.cfg.StatementTimeout+ClientTimeoutMargin)
	}
	return context.WithCancel(ctx)
}

// SQLSTATEs that wrap looks at.
const (
	sqlstateQueryCanceled     = "57014" // query_canceled: a cancel request or the server's statement_timeout
	sqlstateDuplicatePrepared = "42P05" // duplicate_prepared_statement
	sqlstateInvalidStatement  = "26000" // invalid_sql_statement_name: the prepared statement does not exist
	sqlstateClassData         = "22"    // class 22, data_exception: a value the query cannot cast, convert or store
)

// PgBouncerHint is appended to errors with SQLSTATE 42P05 or 26000, which mean that pgx's prepared statements
// went to one server connection and the next query to another: a pooler in transaction mode (PgBouncer, or
// PgBouncer before 1.21 / max_prepared_statements = 0) between keepwarm and PostgreSQL.
const PgBouncerHint = "prepared statements do not survive a transaction-pooling PgBouncer: " +
	"add default_query_exec_mode=exec to the [postgres] dsn (or simple_protocol; or set max_prepared_statements in PgBouncer 1.21+)"

// wrap names the keyspace and keeps cancellation visible: when the caller's ctx ended, the error wraps its
// Err(); when StatementTimeout passed (the server's statement_timeout, or the client-side backstop), it wraps
// context.DeadlineExceeded and says "timeout". pgx reports a cancelled query as SQLSTATE 57014 or as a context
// error depending on timing; either way the original error stays wrapped too. Errors 42P05 and 26000 get
// PgBouncerHint. A data exception (class 22) also wraps ErrBadInput.
func (s *Source) wrap(ctx, qctx context.Context, op string, err error) error {
	var pgErr *pgconn.PgError
	isPg := errors.As(err, &pgErr)
	serverTimeout := isPg && pgErr.Code == sqlstateQueryCanceled && strings.Contains(pgErr.Message, "statement timeout")
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
	case serverTimeout && s.cfg.StatementTimeout > 0:
		return fmt.Errorf("keyspace %q: %s: timeout (server statement_timeout, at most %s): %w: %w", s.cfg.Keyspace, op, s.cfg.StatementTimeout, context.DeadlineExceeded, err)
	case serverTimeout:
		return fmt.Errorf("keyspace %q: %s: timeout (server statement_timeout): %w: %w", s.cfg.Keyspace, op, context.DeadlineExceeded, err)
	case isPg && (pgErr.Code == sqlstateDuplicatePrepared || pgErr.Code == sqlstateInvalidStatement):
		return fmt.Errorf("keyspace %q: %s: %w; %s", s.cfg.Keyspace, op, err, PgBouncerHint)
	case isPg && strings.HasPrefix(pgErr.Code, sqlstateClassData):
		return fmt.Errorf("keyspace %q: %s: %w: %w", s.cfg.Keyspace, op, ErrBadInput, err)
	}
	return fmt.Errorf("keyspace %q: %s: %w", s.cfg.Keyspace, op, err)
}

func (s *Source) typeName(oid uint32) string {
	if t, ok := pgtype.NewMap().TypeForOID(oid); ok {
		return t.Name
	}
	return fmt.Sprintf("oid %d", oid)
}
