package stream

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// FeedColumn is one table column that feeds a keyspace's ids (a keyspace's fed_by entry).
type FeedColumn struct {
	Keyspace string
	Table    string // "schema.table"
	Column   string
}

// CheckFeeds checks feeds against the catalog of pool's database: every table must exist, be an ordinary or
// partitioned table, and have a replica identity (PostgreSQL refuses UPDATE and DELETE on a published table
// without one), and every column must exist in it and be one logical replication sends: not a generated column
// before PostgreSQL 18, never a virtual one (from 18, a stored one is sent once the publication has
// publish_generated_columns = stored, which the stream sets with create_publication). The error lists every
// problem, each naming the keyspace.
// It also returns warnings for columns an UPDATE may change whose old value PostgreSQL does not send: a column that
// is not part of the table's replica identity, unless the table has REPLICA IDENTITY FULL. Then an UPDATE that
// moves a row from one id to another refreshes only the new id (docs/operations.md, "REPLICA IDENTITY").
// Table and column names are bound parameters.
func CheckFeeds(ctx context.Context, pool *pgxpool.Pool, feeds []FeedColumn) (warnings []IdentityWarning, err error) {
	var errs []error
	type ident struct {
		kind   string // relkind
		replid string // relreplident: d default, f full, i index, n nothing
		cols   map[string]bool
		idCols map[string]bool   // columns of the replica identity
		gen    map[string]string // generated columns: attgenerated (s stored, v virtual)
	}
	tables := map[string]*ident{}
	var version int
	if err := pool.QueryRow(ctx, "select current_setting('server_version_num')::int").Scan(&version); err != nil {
		return nil, fmt.Errorf("postgres: read server version: %w", err)
	}
	for _, f := range feeds {
		if _, ok := tables[f.Table]; ok {
			continue
		}
		schema, name, err := SplitTable(f.Table)
		if err != nil {
			errs = append(errs, fmt.Errorf("keyspace %q: fed_by: %w", f.Keyspace, err))
			tables[f.Table] = nil
			continue
		}
		var id ident
		var hasIdent bool
		err = pool.QueryRow(ctx, `select c.relkind::text, c.relreplident::text,
				c.relreplident = 'f' or exists (select 1 from pg_index i where i.indrelid = c.oid and
					((c.relreplident = 'd' and i.indisprimary) or (c.relreplident = 'i' and i.indisreplident)))
			from pg_class c join pg_namespace n on n.oid = c.relnamespace where n.nspname = $1 and c.relname = $2`, schema, name).
			Scan(&id.kind, &id.replid, &hasIdent)
		if errors.Is(err, pgx.ErrNoRows) {
			errs = append(errs, fmt.Errorf("keyspace %q: fed_by: table %s does not exist", f.Keyspace, f.Table))
			tables[f.Table] = nil
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("postgres: read catalog of %s: %w", f.Table, err)
		}
		if id.kind != "r" && id.kind != "p" {
			errs = append(errs, fmt.Errorf("keyspace %q: fed_by: %s is not a table (relkind %s): only tables can be published", f.Keyspace, f.Table, id.kind))
			tables[f.Table] = nil
			continue
		}
		if !hasIdent {
			// PostgreSQL refuses UPDATE and DELETE on a published table without a replica identity: publishing it
			// would break the application's writes.
			errs = append(errs, fmt.Errorf("keyspace %q: fed_by: table %s has no replica identity (no primary key, REPLICA IDENTITY %s): "+
				"once published, its UPDATEs and DELETEs would fail; add a primary key or run ALTER TABLE %s REPLICA IDENTITY FULL",
				f.Keyspace, f.Table, identName(id.replid), f.Table))
			tables[f.Table] = nil
			continue
		}
		rows, err := pool.Query(ctx, `select a.attname::text,
				exists (select 1 from pg_index i where i.indrelid = a.attrelid and a.attnum = any(i.indkey) and
					((c.relreplident = 'd' and i.indisprimary) or (c.relreplident = 'i' and i.indisreplident))),
				a.attgenerated::text
			from pg_attribute a join pg_class c on c.oid = a.attrelid join pg_namespace n on n.oid = c.relnamespace
			where n.nspname = $1 and c.relname = $2 and a.attnum > 0 and not a.attisdropped`, schema, name)
		if err != nil {
			return nil, fmt.Errorf("postgres: read columns of %s: %w", f.Table, err)
		}
		id.cols, id.idCols, id.gen = map[string]bool{}, map[string]bool{}, map[string]string{}
		for rows.Next() {
			var col, gen string
			var inID bool
			if err := rows.Scan(&col, &inID, &gen); err != nil {
				rows.Close()
				return nil, fmt.Errorf("postgres: read columns of %s: %w", f.Table, err)
			}
			id.cols[col], id.idCols[col] = true, inID
			if gen != "" {
				id.gen[col] = gen
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("postgres: read columns of %s: %w", f.Table, err)
		}
		tables[f.Table] = &id
	}
	for _, f := range feeds {
		id := tables[f.Table]
		if id == nil {
			continue
		}
		if !id.cols[f.Column] {
			errs = append(errs, fmt.Errorf("keyspace %q: fed_by: table %s has no column %q", f.Keyspace, f.Table, f.Column))
			continue
		}
		if g := id.gen[f.Column]; g == "v" || (g == "s" && version < 180000) {
			errs = append(errs, fmt.Errorf("keyspace %q: fed_by: %s.%s: %s", f.Keyspace, f.Table, f.Column,
				generatedDetail("", f.Column, g[0], version)))
			continue
		}
		if id.replid != "f" && !id.idCols[f.Column] {
			warnings = append(warnings, IdentityWarning{FeedColumn: f, Identity: identName(id.replid)})
		}
	}
	return warnings, errors.Join(errs...)
}

// IdentityWarning says that an UPDATE of Column does not send its old value: Column is not in the table's replica
// identity, which is Identity (DEFAULT, USING INDEX or NOTHING), not FULL.
type IdentityWarning struct {
	FeedColumn
	Identity string
}

// String explains the warning and gives the fix.
func (w IdentityWarning) String() string {
	return fmt.Sprintf("keyspace %q: fed_by %s.%s: the column is not in the table's replica identity (REPLICA IDENTITY %s): "+
		"an UPDATE that changes it refreshes only the new id; run ALTER TABLE %s REPLICA IDENTITY FULL",
		w.Keyspace, w.Table, w.Column, w.Identity, w.Table)
}

func identName(r string) string {
	switch r {
	case "d":
		return "DEFAULT"
	case "i":
		return "USING INDEX"
	case "n":
		return "NOTHING"
	case "f":
		return "FULL"
	}
	return strings.ToUpper(r)
}
