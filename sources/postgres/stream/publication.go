package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keepwarm/keepwarm/sources/postgres/internal/pgdsn"
)

// The publication: which tables, actions and columns the stream receives. It is read at each session's start and
// every Config.PublicationCheck while streaming (readPublication), repaired where keepwarm owns it
// (Config.CreatePublication: missing tables added back one by one, missing actions and generated columns
// published), and every gap that remains is a Problem, which Status reports.

// SplitTable splits "schema.table" (or "table", schema public) into its parts, which must be plain lower-case
// identifiers.
func SplitTable(t string) (schema, table string, err error) {
	schema, table, ok := strings.Cut(t, ".")
	if !ok {
		schema, table = "public", t
	}
	if !ValidIdent(schema) || !ValidIdent(table) {
		return "", "", fmt.Errorf("table %q: want a lower-case name, optionally schema-qualified (public.track)", t)
	}
	return schema, table, nil
}

// QualifiedTable returns "schema.table" for t ("track" → "public.track").
func QualifiedTable(t string) string {
	s, n, err := SplitTable(t)
	if err != nil {
		return t
	}
	return s + "." + n
}

// Problem kinds, the values of the "kind" label of keepwarm_stream_problems: each names a way in which some
// committed changes of a feeding table do not reach keepwarm, or reach it without what a keyspace needs.
const (
	// ProblemUnpublished: a feeding table is not in the publication (create_publication off, or the role may not
	// add it): its changes do not arrive.
	ProblemUnpublished = "unpublished"
	// ProblemActions: the publication does not publish insert, update, delete and truncate.
	ProblemActions = "publish_actions"
	// ProblemColumnList: the publication's column list for a feeding table omits a fed_by column.
	ProblemColumnList = "column_list"
	// ProblemRowFilter: the publication has a row filter for a feeding table: changes of rows outside it do not
	// arrive.
	ProblemRowFilter = "row_filter"
	// ProblemGenerated: a fed_by column is a generated column, which pgoutput does not send (before PostgreSQL 18;
	// from 18 only stored ones, with publish_generated_columns = stored).
	ProblemGenerated = "generated_column"
	// ProblemColumnMissing: a fed_by column is not among the columns the stream receives for its table (renamed or
	// dropped by a migration, or left out by one of the causes above).
	ProblemColumnMissing = "column_missing"
	// ProblemReplicaIdentity: a fed_by column is not part of its table's replica identity, which is not FULL: an
	// UPDATE that moves a row from one id to another refreshes only the new id.
	ProblemReplicaIdentity = "replica_identity"
)

// problemKinds lists every Problem kind, for the metric's label values.
var problemKinds = []string{ProblemUnpublished, ProblemActions, ProblemColumnList, ProblemRowFilter, ProblemGenerated,
	ProblemColumnMissing, ProblemReplicaIdentity}

// Problem is one gap between what the keyspaces need of the change stream and what PostgreSQL sends it.
type Problem struct {
	Kind   string `json:"kind"`            // ProblemX
	Table  string `json:"table,omitempty"` // "schema.table"; empty for the publication as a whole
	Detail string `json:"detail"`          // what is missing, what it costs, and the fix
}

func (p Problem) String() string {
	if p.Table == "" {
		return p.Detail
	}
	return p.Table + ": " + p.Detail
}

// pubState is what the catalog says of the publication and of the feeding tables (readPublication).
type pubState struct {
	version   int // server_version_num
	exists    bool
	allTables bool
	actions   [4]bool // insert, update, delete, truncate
	viaRoot   bool
	genStored bool // PostgreSQL 18: publish_generated_columns = stored
	published map[string]bool
	colList   map[string][]string // table → its column list in the publication; no entry: all columns
	rowFilter map[string]string   // table → its row filter; no entry: none
	tables    map[string]*tableState
}

// tableState is what the catalog says of one feeding table.
type tableState struct {
	oid         uint32
	partitioned bool
	identity    string             // relreplident: d, f, i, n
	columns     map[string]colInfo // every column
	partitions  []string           // "schema.table" of every partition, at any depth (partitioned tables)
}

type colInfo struct {
	generated  byte // attgenerated: 0 (not generated), 's' stored, 'v' virtual
	inIdentity bool
}

var actionNames = [4]string{"insert", "update", "delete", "truncate"}

// readPublication reads pubState for publication pub and the feeding tables (keys of columns, "schema.table").
// Names reach the SQL only through quoteLiteral, after ValidIdent or SplitTable checked them.
func readPublication(ctx context.Context, conn *pgconn.PgConn, pub string, tables []string) (*pubState, error) {
	st := &pubState{published: map[string]bool{}, colList: map[string][]string{}, rowFilter: map[string]string{},
		tables: map[string]*tableState{}}
	rows, err := query(ctx, conn, "select current_setting('server_version_num')")
	if err != nil {
		return nil, fmt.Errorf("read server version: %w", err)
	}
	st.version, _ = strconv.Atoi(rows[0][0])
	gencols := "'n'"
	if st.version >= 180000 {
		gencols = "pubgencols::text"
	}
	rows, err = query(ctx, conn, "select puballtables::text, pubinsert::text, pubupdate::text, pubdelete::text, pubtruncate::text, "+
		"pubviaroot::text, "+gencols+" from pg_publication where pubname = "+quoteLiteral(pub))
	if err != nil {
		return nil, fmt.Errorf("read publication %q: %w", pub, err)
	}
	if len(rows) > 0 {
		r := rows[0]
		st.exists, st.allTables = true, r[0] == "true"
		for i := range st.actions {
			st.actions[i] = r[1+i] == "true"
		}
		st.viaRoot, st.genStored = r[5] == "true", r[6] == "s"
	}
	for _, t := range tables {
		ts, err := readTable(ctx, conn, t)
		if err != nil {
			return nil, err
		}
		if ts != nil {
			st.tables[QualifiedTable(t)] = ts
		}
	}
	if !st.exists {
		return st, nil
	}
	if st.allTables {
		for _, t := range tables {
			st.published[QualifiedTable(t)] = true
		}
		return st, nil
	}
	// A table is published when pg_publication_rel lists it (a partitioned table is listed there itself, while
	// pg_publication_tables lists its partitions unless publish_via_partition_root is on), or pg_publication_tables
	// does (FOR TABLES IN SCHEMA).
	rows, err = query(ctx, conn, "select schemaname || '.' || tablename from pg_publication_tables where pubname = "+quoteLiteral(pub)+
		" union select n.nspname || '.' || c.relname from pg_publication_rel r join pg_publication p on p.oid = r.prpubid"+
		" join pg_class c on c.oid = r.prrelid join pg_namespace n on n.oid = c.relnamespace where p.pubname = "+quoteLiteral(pub))
	if err != nil {
		return nil, fmt.Errorf("read publication %q tables: %w", pub, err)
	}
	for _, r := range rows {
		st.published[r[0]] = true
	}
	if st.version >= 150000 { // column lists and row filters
		rows, err = query(ctx, conn, "select n.nspname || '.' || c.relname, (r.prattrs is not null)::text,"+
			" coalesce((select string_agg(a.attname, ',' order by a.attnum) from pg_attribute a where a.attrelid = r.prrelid and a.attnum = any(r.prattrs)), ''),"+
			" coalesce(pg_get_expr(r.prqual, r.prrelid), '')"+
			" from pg_publication_rel r join pg_publication p on p.oid = r.prpubid join pg_class c on c.oid = r.prrelid"+
			" join pg_namespace n on n.oid = c.relnamespace where p.pubname = "+quoteLiteral(pub))
		if err != nil {
			return nil, fmt.Errorf("read publication %q column lists: %w", pub, err)
		}
		for _, r := range rows {
			if r[1] == "true" {
				st.colList[r[0]] = strings.Split(r[2], ",")
			}
			if r[3] != "" {
				st.rowFilter[r[0]] = r[3]
			}
		}
	}
	return st, nil
}

// readTable reads one feeding table's catalog entry; nil when it does not exist.
func readTable(ctx context.Context, conn *pgconn.PgConn, t string) (*tableState, error) {
	schema, name, err := SplitTable(t)
	if err != nil {
		return nil, err
	}
	rows, err := query(ctx, conn, "select c.oid::text, (c.relkind = 'p')::text, c.relreplident::text, a.attname, a.attgenerated::text,"+
		" (c.relreplident = 'f' or exists (select 1 from pg_index i where i.indrelid = c.oid and a.attnum = any(i.indkey) and"+
		" ((c.relreplident = 'd' and i.indisprimary) or (c.relreplident = 'i' and i.indisreplident))))::text"+
		" from pg_class c join pg_namespace n on n.oid = c.relnamespace join pg_attribute a on a.attrelid = c.oid"+
		" where n.nspname = "+quoteLiteral(schema)+" and c.relname = "+quoteLiteral(name)+" and a.attnum > 0 and not a.attisdropped")
	if err != nil {
		return nil, fmt.Errorf("read the catalog of %s: %w", t, err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	oid, _ := strconv.ParseUint(rows[0][0], 10, 32)
	ts := &tableState{oid: uint32(oid), partitioned: rows[0][1] == "true", identity: rows[0][2], columns: map[string]colInfo{}}
	for _, r := range rows {
		var g byte
		if r[4] != "" {
			g = r[4][0]
		}
		ts.columns[r[3]] = colInfo{generated: g, inIdentity: r[5] == "true"}
	}
	if ts.partitioned {
		rows, err := query(ctx, conn, "select n.nspname || '.' || c.relname from pg_partition_tree("+strconv.FormatUint(oid, 10)+
			"::oid::regclass) t join pg_class c on c.oid = t.relid join pg_namespace n on n.oid = c.relnamespace where t.level > 0")
		if err != nil {
			return nil, fmt.Errorf("read the partitions of %s: %w", t, err)
		}
		for _, r := range rows {
			ts.partitions = append(ts.partitions, r[0])
		}
		slices.Sort(ts.partitions)
	}
	return ts, nil
}

// query runs one simple-protocol query and returns its rows as text (NULL as "").
func query(ctx context.Context, conn *pgconn.PgConn, sql string) ([][]string, error) {
	res, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(res) == 0 {
		return nil, nil
	}
	out := make([][]string, len(res[0].Rows))
	for i, r := range res[0].Rows {
		out[i] = make([]string, len(r))
		for j, v := range r {
			out[i][j] = string(v)
		}
	}
	return out, nil
}

// problems returns every gap between st and what the keyspaces need of the feeding tables ("schema.table"):
// columns maps a feeding table to its fed_by columns. addErrs holds why adding a table failed (unpublished
// tables).
func (st *pubState) problems(pub string, tables []string, columns map[string][]string, addErrs map[string]error) []Problem {
	var out []Problem
	tables = sortedCopy(tables)
	if st.exists {
		var missing []string
		for i, ok := range st.actions {
			if !ok {
				missing = append(missing, actionNames[i])
			}
		}
		if len(missing) > 0 {
			out = append(out, Problem{Kind: ProblemActions, Detail: fmt.Sprintf(
				"publication %q does not publish %s: those changes do not arrive (ALTER PUBLICATION %s SET (publish = 'insert, update, delete, truncate'))",
				pub, strings.Join(missing, ", "), pub)})
		}
	}
	for _, t := range tables {
		ts := st.tables[t]
		if ts == nil {
			continue // CheckFeeds reports a table that does not exist
		}
		if !st.published[t] {
			why := fmt.Sprintf("not in publication %q: its changes do not arrive, and its keys follow their TTL only (keepwarm migrate up, or ALTER PUBLICATION %s ADD TABLE %s)", pub, pub, t)
			if !st.exists {
				why = fmt.Sprintf("publication %q does not exist: no change arrives (keepwarm migrate up, or %s)", pub, PublicationSQL(pub, tables))
			}
			if err := addErrs[t]; err != nil {
				why += "; adding it failed: " + err.Error()
			}
			out = append(out, Problem{Kind: ProblemUnpublished, Table: t, Detail: why})
			continue
		}
		if f, ok := st.rowFilter[t]; ok {
			out = append(out, Problem{Kind: ProblemRowFilter, Table: t, Detail: fmt.Sprintf(
				"publication %q has the row filter WHERE (%s): changes of other rows do not arrive, and their keys follow their TTL only (ALTER PUBLICATION %s SET TABLE ... without WHERE)", pub, f, pub)})
		}
		for _, c := range columns[t] {
			ci, ok := ts.columns[c]
			switch {
			case !ok:
				out = append(out, Problem{Kind: ProblemColumnMissing, Table: t, Detail: fmt.Sprintf(
					"has no column %q (renamed or dropped?): its changes cannot be mapped to ids; fix fed_by", c)})
			case ci.generated == 'v' || (ci.generated == 's' && (st.version < 180000 || (!st.genStored && !slices.Contains(st.colList[t], c)))):
				out = append(out, Problem{Kind: ProblemGenerated, Table: t, Detail: generatedDetail(pub, c, ci.generated, st.version)})
			case st.colList[t] != nil && !slices.Contains(st.colList[t], c):
				out = append(out, Problem{Kind: ProblemColumnList, Table: t, Detail: fmt.Sprintf(
					"publication %q's column list (%s) omits fed_by column %q: changes cannot be mapped to ids (add it to the list, or publish every column)",
					pub, strings.Join(st.colList[t], ", "), c)})
			case !ts.partitioned && ts.identity != "f" && !ci.inIdentity:
				out = append(out, identityProblem(t, c, identName(ts.identity)))
			}
		}
	}
	return out
}

// generatedDetail explains why a generated fed_by column is not sent, and the fix.
func generatedDetail(pub, col string, kind byte, version int) string {
	switch {
	case kind == 'v':
		return fmt.Sprintf("fed_by column %q is a virtual generated column, which logical replication never sends: feed the keyspace from a stored column", col)
	case version < 180000:
		return fmt.Sprintf("fed_by column %q is a generated column, which PostgreSQL before 18 does not send to logical replication: feed the keyspace from the columns it is computed from", col)
	}
	return fmt.Sprintf("fed_by column %q is a generated column, not published: ALTER PUBLICATION %s SET (publish_generated_columns = stored)", col, pub)
}

func identityProblem(table, col, identity string) Problem {
	return Problem{Kind: ProblemReplicaIdentity, Table: table, Detail: fmt.Sprintf(
		"fed_by column %q is not in the replica identity (REPLICA IDENTITY %s): an UPDATE that moves a row to another id refreshes only the new id (ALTER TABLE %s REPLICA IDENTITY FULL)",
		col, identity, table)}
}

// ensurePublication reads the publication and, with CreatePublication, creates it or repairs what keepwarm
// needs of it: each missing feeding table is added on its own (a table the role may not add is reported, the
// others stream), missing actions are published, publish_via_partition_root is turned on, and a stored generated
// fed_by column is published (PostgreSQL 18). It records the problems that remain (Status.Problems) and the
// partitions of partitioned feeding tables. repaired is true when an existing publication was changed: changes
// committed before the repair were not streamed, so the caller resyncs. The error is a *fatalError only when the
// stream cannot run at all for a reason a retry will not fix; any other error is retried.
func (s *Stream) ensurePublication(ctx context.Context, conn *pgconn.PgConn) (repaired bool, err error) {
	tables, columns := s.feeds()
	pub := s.cfg.Publication
	st, err := readPublication(ctx, conn, pub, tables)
	if err != nil {
		return false, err
	}
	addErrs := map[string]error{}
	if s.cfg.CreatePublication {
		changed, created := false, false
		if !st.exists {
			if err := createPublication(ctx, conn, pub, tables, s.log); err != nil {
				return false, err
			}
			// Created with every table, or empty when the role may not publish one of them: the loop below adds
			// those it may.
			if st, err = readPublication(ctx, conn, pub, tables); err != nil {
				return false, err
			}
			changed, created = true, true
		} else {
			var stmts []string
			if slices.Contains(st.actions[:], false) {
				stmts = append(stmts, fmt.Sprintf("ALTER PUBLICATION %s SET (publish = 'insert, update, delete, truncate')", pub))
			}
			if st.version >= 180000 && !st.genStored && st.needsGenerated(columns) {
				stmts = append(stmts, fmt.Sprintf("ALTER PUBLICATION %s SET (publish_generated_columns = stored)", pub))
			}
			for _, q := range stmts {
				if _, err := conn.Exec(ctx, q).ReadAll(); err != nil {
					s.log.Warn("publication: cannot repair it; reported as a problem", "error", err, "fix", q)
					continue
				}
				s.log.Warn("publication repaired: changes committed before were not streamed; resyncing", "statement", q)
				repaired, changed = true, true
			}
			if !st.viaRoot && st.anyPartitioned() {
				ensureViaRoot(ctx, conn, pub, s.log)
				changed = true
			}
		}
		for _, t := range tables {
			if st.published[t] || st.tables[t] == nil || !st.exists {
				continue
			}
			if err := addTable(ctx, conn, pub, t); err != nil {
				s.log.Error("publication: cannot add a feeding table; the other tables stream", "table", t, "error", err)
				addErrs[t] = err
				continue
			}
			changed = true
			if created {
				continue // a new publication: nothing was streamed from it yet
			}
			s.log.Warn("publication: feeding table added; changes committed while it was out were not streamed: resyncing",
				"publication", pub, "table", t)
			repaired = true
		}
		if changed {
			if st, err = readPublication(ctx, conn, pub, tables); err != nil {
				return repaired, err
			}
		}
	}
	s.noteCatalog(st, st.problems(pub, tables, columns, addErrs))
	return repaired, nil
}

// needsGenerated reports whether a fed_by column is a stored generated column outside any column list.
func (st *pubState) needsGenerated(columns map[string][]string) bool {
	for t, cols := range columns {
		ts := st.tables[t]
		if ts == nil {
			continue
		}
		for _, c := range cols {
			if ts.columns[c].generated == 's' && st.colList[t] == nil {
				return true
			}
		}
	}
	return false
}

func (st *pubState) anyPartitioned() bool {
	for _, ts := range st.tables {
		if ts.partitioned {
			return true
		}
	}
	return false
}

// partitions maps every partition of a partitioned feeding table to that table.
func (st *pubState) partitions() map[string]string {
	out := map[string]string{}
	for t, ts := range st.tables {
		for _, p := range ts.partitions {
			out[p] = t
		}
	}
	return out
}

// createPublication creates pub for tables. When the role may not publish every table at once, it creates the
// publication empty and adds the tables one by one, so that those it may publish stream.
func createPublication(ctx context.Context, conn *pgconn.PgConn, pub string, tables []string, log *slog.Logger) error {
	q := PublicationSQL(pub, tables)
	if len(tables) == 0 {
		q = "CREATE PUBLICATION " + pub + " WITH (publish_via_partition_root = true)"
	}
	_, err := conn.Exec(ctx, q).ReadAll()
	var pe *pgconn.PgError
	switch {
	case err == nil:
		log.Info("publication created", "publication", pub, "tables", tables)
		return nil
	case errors.As(err, &pe) && pe.Code == "42710":
		return nil // another daemon (or migrate up) created it first
	case errors.As(err, &pe) && pe.Code == "42501" && len(tables) > 0:
		// Not the owner of some table: create it empty; ensurePublication adds what it may.
		return createPublication(ctx, conn, pub, nil, log)
	}
	// Not fatal: a role may be granted the right, while the stream retries with back-off (Status.LastError and the
	// log say why meanwhile).
	return fmt.Errorf("postgres: %s: %w (a role that owns the tables must run it; docs/operations.md)", q, err)
}

// addTable adds one table to pub; "already a member" is success.
func addTable(ctx context.Context, conn *pgconn.PgConn, pub, table string) error {
	q := fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", pub, table)
	if _, err := conn.Exec(ctx, q).ReadAll(); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42710" {
			return nil
		}
		return fmt.Errorf("%s: %w", q, err)
	}
	return nil
}

// noteCatalog records the problems a catalog read found (replacing those of the previous read; the problems
// Relation messages report are kept apart, see noteRelation) and the partitions of the feeding tables, logging
// each problem when it appears and when it is gone.
func (s *Stream) noteCatalog(st *pubState, problems []Problem) {
	s.mu.Lock()
	before := s.problemsLocked()
	s.catalogProblems = problems
	s.parts = st.partitions()
	s.pubExists = st.exists
	after := s.problemsLocked()
	s.mu.Unlock()
	s.logProblemChanges(before, after)
	s.publishProblems()
}

// logProblemChanges logs, at ERROR, each problem of after not in before, and at INFO each one that is gone.
func (s *Stream) logProblemChanges(before, after []Problem) {
	for _, p := range after {
		if !slices.Contains(before, p) {
			s.log.Error("change stream: "+p.Detail, "problem", p.Kind, "table", p.Table, "publication", s.cfg.Publication)
		}
	}
	for _, p := range before {
		if !slices.ContainsFunc(after, func(q Problem) bool { return q.Kind == p.Kind && q.Table == p.Table }) {
			s.log.Info("change stream: problem resolved", "problem", p.Kind, "table", p.Table)
		}
	}
}

// tableOIDs reads each feeding table's OID (0 when it does not exist).
func tableOIDs(ctx context.Context, conn *pgconn.PgConn, tables []string) (map[string]uint32, error) {
	out := make(map[string]uint32, len(tables))
	for _, t := range tables {
		ts, err := readTable(ctx, conn, t)
		if err != nil {
			return nil, err
		}
		var oid uint32
		if ts != nil {
			oid = ts.oid
		}
		out[QualifiedTable(t)] = oid
	}
	return out, nil
}

// checkPublication is one check of the publication watch (Config.PublicationCheck), on its own ordinary
// connection: it reads the publication again (ensurePublication: repairs with CreatePublication, problems
// recorded either way) and the feeding tables' OIDs. It returns nil while nothing changed that the stream must
// act on; an error that ends the session, after queueing a resync, when the publication was repaired (a table
// added back, actions published), a feeding table was rebuilt (its OID changed), or a partition of a feeding table
// appeared: the next session resyncs and decodes with the new partitions.
func (s *Stream) checkPublication(ctx context.Context) error {
	pc, err := connConfig(s.cfg.DSN, s.cfg.ConnectTimeout)
	if err != nil {
		return nil // NewStream checked it; nothing to watch with
	}
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		s.log.Debug("publication check: cannot connect; trying again at the next check", "error", err)
		return nil // the replication connection will tell if PostgreSQL is gone
	}
	defer conn.Close(context.WithoutCancel(ctx))
	s.mu.Lock()
	partsBefore := s.parts
	s.mu.Unlock()
	repaired, err := s.ensurePublication(ctx, conn)
	if err != nil {
		s.log.Debug("publication check failed; trying again at the next check", "error", err)
		return nil
	}
	tables, _ := s.feeds()
	oids, err := tableOIDs(ctx, conn, tables)
	if err != nil {
		return nil
	}
	s.mu.Lock()
	before := s.oids
	partsAfter := s.parts
	s.mu.Unlock()
	var rebuilt []string
	for t, oid := range oids {
		if was, ok := before[t]; ok && was != 0 && oid != 0 && was != oid {
			rebuilt = append(rebuilt, t)
		}
	}
	slices.Sort(rebuilt)
	var newParts []string
	for p := range partsAfter {
		if _, ok := partsBefore[p]; !ok {
			newParts = append(newParts, p)
		}
	}
	slices.Sort(newParts)
	switch {
	case repaired:
		s.queueResync(ResyncPublication)
		return errors.New("the publication was repaired: resyncing")
	case len(rebuilt) > 0:
		s.queueResync(ResyncRebuilt)
		return fmt.Errorf("feeding tables %s were rebuilt (their OIDs changed): resyncing", strings.Join(rebuilt, ", "))
	case len(newParts) > 0:
		s.queueResync(ResyncPublication)
		return fmt.Errorf("new partitions %s of feeding tables: resyncing", strings.Join(newParts, ", "))
	}
	return nil
}

// PublicationSQL returns the statement that creates publication for tables, for the docs and error messages.
// It publishes a partitioned table's changes under the table's own name (publish_via_partition_root), which is
// the name fed_by gives, not under each partition's.
func PublicationSQL(publication string, tables []string) string {
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish_via_partition_root = true)", publication,
		strings.Join(tables, ", "))
}

// ensureViaRoot turns publish_via_partition_root on for an existing publication (one created before keepwarm
// set it, or by hand, or turned off since). The stream maps a partition's changes to its partitioned table
// either way (decoder.rename); this keeps the names the publication sends the ones fed_by gives. A failure is
// logged, not returned.
func ensureViaRoot(ctx context.Context, conn *pgconn.PgConn, pub string, log *slog.Logger) {
	q := fmt.Sprintf("ALTER PUBLICATION %s SET (publish_via_partition_root = true)", pub)
	if _, err := conn.Exec(ctx, q).ReadAll(); err != nil {
		if log != nil {
			log.Warn("publication: cannot turn publish_via_partition_root on; partitions' changes are mapped to their tables by name",
				"publication", pub, "error", err, "fix", q)
		}
		return
	}
	if log != nil {
		log.Info("publication updated: partitioned tables publish under their own name", "publication", pub)
	}
}

// EnsurePublication creates publication for tables ("schema.table") on the database of dsn, or adds the tables
// it lacks, publishes every action and turns publish_via_partition_root on. `keepwarm migrate up` runs it. It
// needs a role that owns the tables (or a superuser); the error names each table it could not add.
func EnsurePublication(ctx context.Context, dsn, publication string, tables []string) error {
	if !ValidIdent(publication) {
		return fmt.Errorf("postgres: publication %q is not a valid name", publication)
	}
	for _, t := range tables {
		if _, _, err := SplitTable(t); err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
	}
	pc, err := connConfig(dsn, 0)
	if err != nil {
		return fmt.Errorf("postgres: parse dsn: %w", pgdsn.Scrub(err))
	}
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("postgres: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	quoted := make([]string, len(tables))
	for i, t := range tables {
		quoted[i] = QualifiedTable(t)
	}
	st, err := readPublication(ctx, conn, publication, quoted)
	if err != nil {
		return err
	}
	if !st.exists {
		return createPublication(ctx, conn, publication, quoted, slog.New(slog.DiscardHandler))
	}
	var errs []error
	if slices.Contains(st.actions[:], false) {
		q := fmt.Sprintf("ALTER PUBLICATION %s SET (publish = 'insert, update, delete, truncate')", publication)
		if _, err := conn.Exec(ctx, q).ReadAll(); err != nil {
			errs = append(errs, fmt.Errorf("postgres: %s: %w", q, err))
		}
	}
	if !st.viaRoot {
		ensureViaRoot(ctx, conn, publication, nil)
	}
	for _, t := range quoted {
		if !st.published[t] {
			if err := addTable(ctx, conn, publication, t); err != nil {
				errs = append(errs, fmt.Errorf("postgres: %w (a role that owns the table must run it)", err))
			}
		}
	}
	return errors.Join(errs...)
}
