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
// missing. Each Fetch runs under the keyspace's statement timeout; IDs streams the optional ids_query for
// warmups with no timeout of its own.
//
// Source implements the contract described in package sources and passes sources/sourcetest.
package postgres
