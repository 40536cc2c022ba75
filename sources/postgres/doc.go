// Package postgres is the PostgreSQL source: it rebuilds a keyspace's values with one SQL query per batch.
//
// A keyspace's query takes the batch of ids as $1 (text[]; ids are always bound, never spliced into SQL) and
// returns rows (id, value):
//
//	with ids as (select id from unnest($1::text[]) as id where id ~ '^[0-9]{1,9}$')
//	select ids.id, json_build_object('id', t.track_id, 'name', t.name) as value
//	from ids join track t on t.track_id = ids.id::int
//
// Filtering the ids before the cast keeps a stray id ("abc") from failing the whole batch, and returning
// ids.id gives back each id exactly as requested. The value is written to Redis byte for byte: json and jsonb as
// psql prints them, text as is, bytea raw. An id the query does not return, or returns with a NULL value, is
// missing.
//
// # Ids the origin cannot take
//
// No PostgreSQL text value can hold a NUL byte: bound in $1, an id with one fails the whole batch (22021, or 08P01
// and a lost connection in simple_protocol mode). ValidID refuses such ids (and invalid UTF-8); the warmer and the
// config loader ask it, and Fetch refuses a batch holding one with ErrBadInput before sending anything. A data
// exception the server raises for one id (SQLSTATE class 22, e.g. a query that casts ids to int and meets "abc")
// also comes back as ErrBadInput, so that the warmer splits the batch, writes the other ids and counts the one at
// fault, rather than taking the origin for down.
//
// # Query modes and PgBouncer
//
// Values are decoded by the wire format each column really came in, so they are the same bytes in all five of
// pgx's default_query_exec_mode settings (cache_statement, the default; cache_describe; describe_exec; exec;
// simple_protocol): in exec and simple_protocol modes the server sends every column as text, jsonb without its
// binary version byte and bytea in its bytea_output form (hex or escape), and both are decoded.
//
// Behind PgBouncer in pool_mode = transaction, pgx's default statement cache fails: a statement prepared in one
// transaction is on a server connection the next transaction may not get (SQLSTATE 26000), or another client's
// identically named statement is already there (42P05). Set default_query_exec_mode=exec in the DSN (or
// simple_protocol, or cache_describe, which all use unnamed statements; or enable max_prepared_statements in
// PgBouncer 1.21+). Fetch's errors with those SQLSTATEs end with PgBouncerHint, and CheckStatementCache, run by
// `keepwarm validate --check-db`, detects the setup before it fails.
//
// # Timeouts and the pool
//
// Each Fetch first waits at most PoolWaitTimeout for a pool connection (ErrPoolExhausted, "pool exhausted
// (max_conns N)", when none comes free; the wait is in keepwarm_origin_pool_wait_seconds), then runs its query
// in a transaction that begins with SET LOCAL statement_timeout: PostgreSQL cancels a slow query itself and the
// connection stays usable, where pgx's client-side cancel would close it. SET LOCAL ends with the transaction, so
// it is safe through PgBouncer in transaction mode. IDs streams the optional ids_query for warmups on a
// connection of its own, outside the pool, with no timeout of its own.
//
// Source implements the contract documented on warmer.Source and passes sources/sourcetest.
package postgres
