package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// The publication: which tables the stream follows, created or kept complete when StreamConfig.CreatePublication
// is set, and watched while streaming (StreamConfig.PublicationCheck).

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

// ensurePublication checks that the publication exists and includes every feeding table; with
// CreatePublication it creates or extends it.
func (s *Stream) ensurePublication(ctx context.Context, conn *pgconn.PgConn) error {
	missing, exists, err := publicationMissing(ctx, conn, s.cfg.Publication, s.cfg.Tables)
	if err != nil {
		return err
	}
	if exists && s.cfg.CreatePublication {
		if err := ensureViaRoot(ctx, conn, s.cfg.Publication, s.log); err != nil {
			return err
		}
	}
	if exists && len(missing) == 0 {
		return nil
	}
	if !s.cfg.CreatePublication {
		if !exists {
			return &fatalError{fmt.Errorf("postgres: publication %q does not exist: run `keepwarm migrate up` or %s",
				s.cfg.Publication, PublicationSQL(s.cfg.Publication, s.cfg.Tables))}
		}
		s.noteUnpublished(missing)
		return nil // stream the tables that are published; the others are reported
	}
	return execPublication(ctx, conn, s.cfg.Publication, missing, exists, s.log)
}

// noteUnpublished records the feeding tables the publication lacks (CreatePublication off), logging when the
// list changes: their changes cannot arrive, which Status, the metric and the log say.
func (s *Stream) noteUnpublished(missing []string) {
	s.mu.Lock()
	changed := !slices.Equal(s.st.Unpublished, missing)
	s.st.Unpublished = slices.Clone(missing)
	s.mu.Unlock()
	s.m.unpublished.Set(float64(len(missing)))
	if !changed {
		return
	}
	if len(missing) == 0 {
		s.log.Info("publication: every feeding table is published again", "publication", s.cfg.Publication)
		return
	}
	s.log.Error("publication lacks feeding tables: their changes do not arrive, and their keys follow their TTL only",
		"publication", s.cfg.Publication, "tables", missing,
		"fix", fmt.Sprintf("keepwarm migrate up, or ALTER PUBLICATION %s ADD TABLE %s", s.cfg.Publication, strings.Join(missing, ", ")))
}

// tableOIDs reads each feeding table's OID (0 when it does not exist).
func tableOIDs(ctx context.Context, conn *pgconn.PgConn, tables []string) (map[string]uint32, error) {
	out := make(map[string]uint32, len(tables))
	for _, t := range tables {
		schema, name, err := SplitTable(t)
		if err != nil {
			return nil, err
		}
		res, err := conn.Exec(ctx, "select c.oid::text from pg_class c join pg_namespace n on n.oid = c.relnamespace where n.nspname = "+
			quoteLiteral(schema)+" and c.relname = "+quoteLiteral(name)).ReadAll()
		if err != nil {
			return nil, fmt.Errorf("read the OID of %s: %w", t, err)
		}
		var oid uint64
		if len(res[0].Rows) > 0 {
			oid, _ = strconv.ParseUint(string(res[0].Rows[0][0]), 10, 32)
		}
		out[QualifiedTable(t)] = uint32(oid)
	}
	return out, nil
}

// checkPublication is one check of the publication watch (StreamConfig.PublicationCheck), on its own ordinary
// connection: nil while nothing changed; an error that ends the session (the next one re-adds the table and
// resyncs) when a feeding table left the publication (with CreatePublication) or was rebuilt.
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
	missing, exists, err := publicationMissing(ctx, conn, s.cfg.Publication, s.cfg.Tables)
	if err != nil {
		return nil
	}
	oids, err := tableOIDs(ctx, conn, s.cfg.Tables)
	if err != nil {
		return nil
	}
	s.mu.Lock()
	before := s.oids
	s.mu.Unlock()
	var rebuilt []string
	for t, oid := range oids {
		if was, ok := before[t]; ok && was != 0 && oid != 0 && was != oid {
			rebuilt = append(rebuilt, t)
		}
	}
	slices.Sort(rebuilt)
	switch {
	case !exists || (len(missing) > 0 && s.cfg.CreatePublication):
		s.queueResync(ResyncPublication)
		return fmt.Errorf("publication %q lacks feeding tables %s (a table rebuilt by a migration?): adding them back and resyncing",
			s.cfg.Publication, strings.Join(missing, ", "))
	case len(rebuilt) > 0:
		s.queueResync(ResyncRebuilt)
		return fmt.Errorf("feeding tables %s were rebuilt (their OIDs changed): resyncing", strings.Join(rebuilt, ", "))
	}
	s.noteUnpublished(missing)
	return nil
}

// PublicationSQL returns the statement that creates publication for tables, for the docs and error messages.
// It publishes a partitioned table's changes under the table's own name (publish_via_partition_root), which is
// the name fed_by gives, not under each partition's.
func PublicationSQL(publication string, tables []string) string {
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish_via_partition_root = true)", publication,
		strings.Join(tables, ", "))
}

// publicationMissing returns the tables ("schema.table") the publication lacks, and whether it exists. A table
// is published when it is listed in pg_publication_rel (a partitioned table is listed there itself, while
// pg_publication_tables lists its partitions unless publish_via_partition_root is on), or in
// pg_publication_tables (FOR ALL TABLES, FOR TABLES IN SCHEMA).
func publicationMissing(ctx context.Context, conn *pgconn.PgConn, pub string, tables []string) (missing []string, exists bool, err error) {
	res, err := conn.Exec(ctx, "select puballtables::text from pg_publication where pubname = "+quoteLiteral(pub)).ReadAll()
	if err != nil {
		return nil, false, fmt.Errorf("read publication %q: %w", pub, err)
	}
	if len(res[0].Rows) == 0 {
		return tables, false, nil
	}
	if string(res[0].Rows[0][0]) == "true" {
		return nil, true, nil
	}
	res, err = conn.Exec(ctx, "select schemaname || '.' || tablename from pg_publication_tables where pubname = "+quoteLiteral(pub)+
		" union select n.nspname || '.' || c.relname from pg_publication_rel r join pg_publication p on p.oid = r.prpubid"+
		" join pg_class c on c.oid = r.prrelid join pg_namespace n on n.oid = c.relnamespace where p.pubname = "+quoteLiteral(pub)).ReadAll()
	if err != nil {
		return nil, true, fmt.Errorf("read publication %q tables: %w", pub, err)
	}
	have := map[string]bool{}
	for _, r := range res[0].Rows {
		have[string(r[0])] = true
	}
	for _, t := range tables {
		if !have[QualifiedTable(t)] {
			missing = append(missing, QualifiedTable(t))
		}
	}
	return missing, true, nil
}

func execPublication(ctx context.Context, conn *pgconn.PgConn, pub string, tables []string, exists bool, log *slog.Logger) error {
	q := PublicationSQL(pub, tables)
	if exists {
		q = fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", pub, strings.Join(tables, ", "))
	}
	if len(tables) == 0 {
		q = "CREATE PUBLICATION " + pub // no table yet: changes to none
	}
	if _, err := conn.Exec(ctx, q).ReadAll(); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42710" {
			return nil // "already member": another daemon (or migrate up) added it first
		}
		// Not fatal: a role may be granted ownership, or the table created, while the stream retries with back-off
		// (Status.LastError and the log say why meanwhile).
		return fmt.Errorf("postgres: %s: %w (a role that owns the tables must run it; docs/operations.md)", q, err)
	}
	if log != nil {
		log.Info("publication updated", "publication", pub, "tables", tables, "created", !exists)
	}
	return nil
}

// ensureViaRoot turns publish_via_partition_root on for an existing publication (one created before keepwarm
// set it, or by hand), so that a partitioned fed table's changes arrive under its own name. For tables that are
// not partitioned it changes nothing.
func ensureViaRoot(ctx context.Context, conn *pgconn.PgConn, pub string, log *slog.Logger) error {
	res, err := conn.Exec(ctx, "select pubviaroot::text from pg_publication where pubname = "+quoteLiteral(pub)).ReadAll()
	if err != nil {
		return fmt.Errorf("read publication %q: %w", pub, err)
	}
	if len(res[0].Rows) == 0 || string(res[0].Rows[0][0]) == "true" {
		return nil
	}
	q := fmt.Sprintf("ALTER PUBLICATION %s SET (publish_via_partition_root = true)", pub)
	if _, err := conn.Exec(ctx, q).ReadAll(); err != nil {
		// Not fatal: unpartitioned tables stream the same either way; a partitioned one's changes arrive under
		// its partitions' names until an owner runs it.
		if log != nil {
			log.Warn("publication: cannot turn publish_via_partition_root on; a partitioned feeding table's changes will not match its keyspace",
				"publication", pub, "error", err, "fix", q)
		}
		return nil
	}
	if log != nil {
		log.Info("publication updated: partitioned tables publish under their own name", "publication", pub)
	}
	return nil
}

// EnsurePublication creates publication for tables ("schema.table") on the database of dsn, or adds the tables
// it lacks. `keepwarm migrate up` runs it. It needs a role that owns the tables (or a superuser).
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
		return fmt.Errorf("postgres: parse dsn: %w", scrubParseError(err))
	}
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("postgres: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	missing, exists, err := publicationMissing(ctx, conn, publication, tables)
	if err != nil {
		return err
	}
	var fe *fatalError
	if exists {
		if err := ensureViaRoot(ctx, conn, publication, nil); errors.As(err, &fe) {
			return fe.err
		} else if err != nil {
			return err
		}
	}
	if exists && len(missing) == 0 {
		return nil
	}
	if err := execPublication(ctx, conn, publication, missing, exists, nil); errors.As(err, &fe) {
		return fe.err
	} else if err != nil {
		return err
	}
	return nil
}
