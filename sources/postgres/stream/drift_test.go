package stream_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/sources/postgres/stream"
)

// drift is a stream of table item in a throwaway database (driftStream).
type drift struct {
	s       *stream.Stream
	cfg     stream.Config
	rec     *recorder
	resyncs *resyncLog
	pool    *pgxpool.Pool
	reg     *prometheus.Registry
}

// driftStream starts a stream of table item in a throwaway database, keeping columns (nil: all). setup runs before
// the stream starts (a publication of its own, say; pub is the publication's and the slot's name).
func driftStream(t *testing.T, create bool, columns map[string][]string, setup func(pool *pgxpool.Pool, pub string)) *drift {
	t.Helper()
	slot := slotName()
	dsn, pool := streamDB(t, slot)
	if setup != nil {
		setup(pool, slot)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "drop publication if exists "+slot) })
	d := &drift{rec: &recorder{}, resyncs: &resyncLog{}, pool: pool, reg: prometheus.NewRegistry()}
	d.cfg = stream.Config{DSN: dsn, Slot: slot, Publication: slot,
		Tables: []string{"item"}, Columns: columns, CreatePublication: create, Gather: -1, StatusInterval: time.Second,
		PublicationCheck: 100 * time.Millisecond, Resync: d.resyncs.resync, Registerer: d.reg}
	var err error
	if d.s, err = stream.New(d.cfg); err != nil {
		t.Fatal(err)
	}
	run(t, d.s, d.rec.apply)
	testenv.Eventually(t, 15*time.Second, "stream streaming", func() bool { return d.s.Status().State == "streaming" })
	return d
}

func sqlExec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// arrived waits for a change whose new name is name and returns it.
func arrived(t *testing.T, rec *recorder, name string) stream.Change {
	t.Helper()
	var got stream.Change
	testenv.Eventually(t, 15*time.Second, fmt.Sprintf("the change naming %q arrives", name), func() bool {
		for _, c := range rec.changes() {
			if c.New["name"] == name {
				got = c
				return true
			}
		}
		return false
	})
	return got
}

func hasProblem(s *stream.Stream, kind, table string) bool {
	return slices.ContainsFunc(s.Status().Problems, func(p stream.Problem) bool { return p.Kind == kind && p.Table == table })
}

// TestStreamPublicationDroppedAndCreatedAgain: an operator (or a migration tool) drops the publication and creates
// it again while the slot survives, with a commit in between. pgoutput looks the publication up as of the LSN it
// decodes, where the new one does not exist: "publication does not exist" (42704) at every reconnect, forever,
// while the slot retained WAL. The stream must recreate the slot, resync (the change in the gap was never
// published), and stream the next update.
func TestStreamPublicationDroppedAndCreatedAgain(t *testing.T) {
	t.Parallel()
	d := driftStream(t, true, nil, nil)
	s, rec, resyncs, pool := d.s, d.rec, d.resyncs, d.pool
	pub := s.Status().Publication
	sqlExec(t, pool, "update item set name = 'before' where id = 1")
	arrived(t, rec, "before")
	sqlExec(t, pool, "drop publication "+pub)
	sqlExec(t, pool, "update item set name = 'in the gap' where id = 2")
	sqlExec(t, pool, "create publication "+pub+" for table item")
	testenv.Eventually(t, 15*time.Second, "resynced: the change in the gap was never published", func() bool {
		return slices.Contains(resyncs.all(), stream.ResyncPublicationGap)
	})
	testenv.Eventually(t, 10*time.Second, "streaming again", func() bool { return s.Status().State == "streaming" })
	// The new slot starts after the resync: later commits stream again.
	sqlExec(t, pool, "update item set name = 'after' where id = 3")
	arrived(t, rec, "after")
}

// TestStreamReportsPublicationDrift: a publication that does not publish updates, or whose column list omits the
// fed_by column, or that filters rows, loses changes without a word: no log line, /readyz 200, and validate
// --check-db silent. Each is now a Problem in Status (which the daemon reports as degraded), and CheckStream
// names it. With create_publication the missing actions are published again and the stream resyncs.
func TestStreamReportsPublicationDrift(t *testing.T) {
	t.Parallel()
	cols := map[string][]string{"item": {"grp"}}
	for _, tc := range []struct {
		name, pub string // pub: how the publication is created ("%s" is its name)
		create    bool
		kinds     []string // problems expected
	}{
		{"publish insert only", "create publication %s for table item with (publish = 'insert')", false, []string{stream.ProblemActions}},
		{"column list without grp", "create publication %s for table item (id, name)", false, []string{stream.ProblemColumnList}},
		{"row filter", "create publication %s for table item where (id < 5)", false, []string{stream.ProblemRowFilter}},
		{"publish insert only, repaired", "create publication %s for table item with (publish = 'insert')", true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := driftStream(t, tc.create, cols, func(pool *pgxpool.Pool, pub string) {
				sqlExec(t, pool, fmt.Sprintf(tc.pub, pub))
			})
			s, rec, resyncs, pool := d.s, d.rec, d.resyncs, d.pool
			for _, k := range tc.kinds {
				testenv.Eventually(t, 10*time.Second, "problem "+k+" reported", func() bool { return hasProblem(s, k, "public.item") || hasProblem(s, k, "") })
				if got := testenv.MetricSum(t, d.reg, "keepwarm_stream_problems", map[string]string{"kind": k}); got < 1 {
					t.Errorf("keepwarm_stream_problems{kind=%q} = %v, want >= 1", k, got)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := stream.Check(ctx, d.cfg)
				cancel()
				if err == nil || !strings.Contains(err.Error(), d.cfg.Publication) {
					t.Errorf("CheckStream (validate --check-db): %v, want an error naming the publication", err)
				}
			}
			if tc.create {
				testenv.Eventually(t, 10*time.Second, "resynced after the repair", func() bool {
					return slices.Contains(resyncs.all(), stream.ResyncPublication)
				})
				testenv.Eventually(t, 10*time.Second, "streaming again", func() bool { return s.Status().State == "streaming" })
				sqlExec(t, pool, "update item set grp = 7 where id = 1")
				testenv.Eventually(t, 15*time.Second, "the update after the repair arrives (only grp is kept)", func() bool {
					return slices.ContainsFunc(rec.changes(), func(c stream.Change) bool { return c.Op == 'U' && c.New["grp"] == "7" })
				})
				if ps := s.Status().Problems; len(ps) != 0 {
					t.Errorf("problems after the repair: %v, want none", ps)
				}
			}
		})
	}
}

// TestGeneratedFedColumn: pgoutput sends no generated column before PostgreSQL 18, so a keyspace fed by one never
// refreshes, even with REPLICA IDENTITY FULL. validate --check-db (CheckFeeds) refuses it, naming the keyspace and
// the column, and a running stream reports it.
func TestGeneratedFedColumn(t *testing.T) {
	t.Parallel()
	d := driftStream(t, true, map[string][]string{"item": {"twice"}}, func(pool *pgxpool.Pool, _ string) {
		sqlExec(t, pool, "alter table item add column twice int generated always as (grp * 2) stored")
	})
	var version int
	if err := d.pool.QueryRow(context.Background(), "select current_setting('server_version_num')::int").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version >= 180000 {
		t.Fatalf("this test expects PostgreSQL before 18 (generated columns are not sent); the server is %d", version)
	}
	_, err := stream.CheckFeeds(context.Background(), d.pool, []stream.FeedColumn{{Keyspace: "k", Table: "public.item", Column: "twice"}})
	if err == nil || !strings.Contains(err.Error(), `keyspace "k"`) || !strings.Contains(err.Error(), "generated") {
		t.Errorf("CheckFeeds of a generated column: %v, want an error naming the keyspace and saying it is generated", err)
	}
	testenv.Eventually(t, 10*time.Second, "a generated_column problem", func() bool { return hasProblem(d.s, stream.ProblemGenerated, "public.item") })
	// The stream does not receive the column: the first change of the table says so too.
	sqlExec(t, d.pool, "update item set grp = 2 where id = 1")
	testenv.Eventually(t, 10*time.Second, "a column_missing problem from the Relation message", func() bool {
		return hasProblem(d.s, stream.ProblemColumnMissing, "public.item")
	})
}

// TestStreamReconfigure: a reload that adds a fed_by column, or follows a column renamed by a migration, took
// effect only at the next restart (the decoder's kept columns were fixed when the stream started); after a rename,
// never, while the stream said "streaming". The rename is reported at the table's first change, and Reconfigure
// resyncs and decodes with the new columns at once.
func TestStreamReconfigure(t *testing.T) {
	t.Parallel()
	d := driftStream(t, true, map[string][]string{"item": {"grp"}}, nil)
	sqlExec(t, d.pool, "alter table item rename column grp to bucket")
	sqlExec(t, d.pool, "update item set bucket = 5 where id = 1")
	testenv.Eventually(t, 10*time.Second, "the renamed column reported missing", func() bool {
		return hasProblem(d.s, stream.ProblemColumnMissing, "public.item")
	})
	if err := d.s.Reconfigure([]string{"item"}, map[string][]string{"item": {"bucket", "name"}}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "resynced after the reconfiguration", func() bool {
		return slices.Contains(d.resyncs.all(), stream.ResyncReconfigured)
	})
	sqlExec(t, d.pool, "update item set bucket = 6, name = 'six' where id = 2")
	c := arrived(t, d.rec, "six")
	if c.New["bucket"] != "6" {
		t.Errorf("change after Reconfigure: %+v, want bucket and name kept", c)
	}
	testenv.Eventually(t, 10*time.Second, "the problem resolved", func() bool {
		return !hasProblem(d.s, stream.ProblemColumnMissing, "public.item")
	})
	if err := d.s.Reconfigure([]string{"Bad Table"}, nil); err == nil {
		t.Error("Reconfigure with an invalid table name: no error")
	}
}

// TestStreamReplicaIdentityFlip: REPLICA IDENTITY FULL → DEFAULT while streaming, then a track moved to another
// album: PostgreSQL no longer sends the old album, so album 1's key keeps the track until its TTL, and nobody was
// told. The Relation message that precedes the change carries the new identity: a replica_identity problem, and
// the update counted in keepwarm_stream_old_ids_unknown_total. Back to FULL, the problem goes.
func TestStreamReplicaIdentityFlip(t *testing.T) {
	t.Parallel()
	d := driftStream(t, true, map[string][]string{"item": {"grp"}}, nil) // grp is not in the primary key
	sqlExec(t, d.pool, "update item set grp = 1 where id = 1")
	testenv.Eventually(t, 10*time.Second, "the first update arrives with its old row", func() bool {
		return slices.ContainsFunc(d.rec.changes(), func(c stream.Change) bool { return c.New["grp"] == "1" && c.Old != nil })
	})
	if hasProblem(d.s, stream.ProblemReplicaIdentity, "public.item") {
		t.Fatal("a replica_identity problem with REPLICA IDENTITY FULL")
	}
	sqlExec(t, d.pool, "alter table item replica identity default")
	sqlExec(t, d.pool, "update item set grp = 2 where id = 1")
	testenv.Eventually(t, 10*time.Second, "a replica_identity problem", func() bool {
		return hasProblem(d.s, stream.ProblemReplicaIdentity, "public.item")
	})
	testenv.Eventually(t, 10*time.Second, "the update without its old group counted", func() bool {
		return testenv.MetricSum(t, d.reg, "keepwarm_stream_old_ids_unknown_total", nil) >= 1
	})
	sqlExec(t, d.pool, "alter table item replica identity full")
	sqlExec(t, d.pool, "update item set grp = 0 where id = 1")
	testenv.Eventually(t, 10*time.Second, "the problem gone with FULL again", func() bool {
		return !hasProblem(d.s, stream.ProblemReplicaIdentity, "public.item")
	})
}

// TestStreamPartitionRootFlip: publish_via_partition_root set back to false while streaming: a partition's
// changes arrive under the partition's name and matched no keyspace (95 s of missed updates until a later
// reconnect). The stream maps a partition to its partitioned table, so the change arrives under the table's name.
func TestStreamPartitionRootFlip(t *testing.T) {
	t.Parallel()
	slot := slotName()
	dsn, pool := streamDB(t, slot)
	sqlExec(t, pool, `create table part (id int, grp int, name text, primary key (id, grp)) partition by list (grp);
		create table part_0 partition of part for values in (0);
		create table part_1 partition of part for values in (1, 2);
		alter table part_0 replica identity full;
		alter table part_1 replica identity full;
		insert into part select g, g % 3, 'part ' || g from generate_series(1, 10) g`)
	sqlExec(t, pool, "create publication "+slot+" for table part with (publish_via_partition_root = true)")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "drop publication if exists "+slot) })
	rec := &recorder{}
	s, err := stream.New(stream.Config{DSN: dsn, Slot: slot, Publication: slot, Tables: []string{"part"},
		CreatePublication: false, Gather: -1, StatusInterval: time.Second, Resync: (&resyncLog{}).resync})
	if err != nil {
		t.Fatal(err)
	}
	run(t, s, rec.apply)
	testenv.Eventually(t, 15*time.Second, "stream streaming", func() bool { return s.Status().State == "streaming" })
	sqlExec(t, pool, "alter publication "+slot+" set (publish_via_partition_root = false)")
	sqlExec(t, pool, "update part set name = 'flipped' where id = 4") // grp 1: in part_1
	if c := arrived(t, rec, "flipped"); c.Table != "public.part" {
		t.Errorf("the change arrived under %q, want public.part (the table fed_by names)", c.Table)
	}
}

// TestStreamPermissionPerTable: the stream's role may not add one feeding table to the publication (it does not
// own it). The whole stream used to stay down, so updates of the tables already published were lost too. Now that
// table is an unpublished problem, naming why, and the others stream.
func TestStreamPermissionPerTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := testenv.Postgres(t)
	role := "kwrole_" + strings.ToLower(slotName()[7:])
	if _, err := admin.Exec(ctx, "create role "+role+" login replication"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "drop role if exists "+role) }) // after the database's drop
	slot := slotName()
	dsn, pool := streamDB(t, slot)
	sqlExec(t, pool, "create table secret (id int primary key, v text); alter table item owner to "+role)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "drop owned by "+role) })
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	sqlExec(t, pool, "grant create on database "+pc.Database+" to "+role) // CREATE PUBLICATION needs it
	roleDSN := strings.Replace(dsn, "://"+pc.User+"@", "://"+role+"@", 1)
	rec := &recorder{}
	var s *stream.Stream
	s, err = stream.New(stream.Config{DSN: roleDSN, Slot: slot, Publication: slot,
		Tables: []string{"item", "secret"}, CreatePublication: true, Gather: -1, StatusInterval: time.Second,
		Resync: (&resyncLog{}).resync})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "drop publication if exists "+slot) })
	run(t, s, rec.apply)
	testenv.Eventually(t, 15*time.Second, "streaming, with secret unpublished", func() bool {
		st := s.Status()
		return st.State == "streaming" && slices.Equal(st.Unpublished, []string{"public.secret"})
	})
	sqlExec(t, pool, "update item set name = 'still streamed' where id = 1")
	arrived(t, rec, "still streamed")
	i := slices.IndexFunc(s.Status().Problems, func(p stream.Problem) bool { return p.Table == "public.secret" })
	if p := s.Status().Problems[i]; !strings.Contains(p.Detail, "must be owner") {
		t.Errorf("the problem does not say why: %s", p.Detail)
	}
}
