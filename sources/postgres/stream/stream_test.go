package stream_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/sources/postgres/stream"
)

// streamDB creates a throwaway database with table item(id int primary key, grp int, name text) and returns its
// URL and a pool. The slot named slot is dropped before the database (a slot keeps its database alive).
func streamDB(t *testing.T, slot string) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	dsn := testenv.Database(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(func() {
		// Runs before the database drop (cleanups run last-in first-out): wait for the slot to be released.
		testenv.Poll(10*time.Second, func() bool {
			_, err := pool.Exec(ctx, "select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = $1", slot)
			return err == nil
		})
		pool.Close()
	})
	if _, err := pool.Exec(ctx, `create table item (id int primary key, grp int, name text);
		alter table item replica identity full;
		insert into item select g, g % 3, 'item ' || g from generate_series(1, 10) g`); err != nil {
		t.Fatalf("create table: %v", err)
	}
	return dsn, pool
}

// recorder is an apply function that records what it is given and can be made to fail.
type recorder struct {
	mu     sync.Mutex
	txns   []stream.Txn
	fail   error
	calls  int
	failed []stream.Txn // the transactions offered while failing, in the order offered
}

func (r *recorder) apply(_ context.Context, txns []stream.Txn) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if r.fail != nil {
		r.failed = append(r.failed, txns...)
		return r.fail
	}
	r.txns = append(r.txns, txns...)
	return nil
}

func (r *recorder) changes() []stream.Change {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []stream.Change
	for _, t := range r.txns {
		out = append(out, t.Changes...)
	}
	return out
}

func (r *recorder) setFail(err error) {
	r.mu.Lock()
	r.fail = err
	r.mu.Unlock()
}

// run starts s.Run(apply) and returns a function that stops it and returns Run's error.
func run(t *testing.T, s *stream.Stream, apply func(context.Context, []stream.Txn) error) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, apply) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func newStream(t *testing.T, dsn, slot string, resyncs *[]string, mu *sync.Mutex) *stream.Stream {
	t.Helper()
	s, err := stream.New(stream.Config{DSN: dsn, Slot: slot, Publication: slot,
		Tables: []string{"item"}, CreatePublication: true, Gather: -1, StatusInterval: time.Second,
		Resync: func(_ context.Context, reason string) error {
			mu.Lock()
			defer mu.Unlock()
			*resyncs = append(*resyncs, reason)
			return nil
		}})
	if err != nil {
		t.Fatalf("NewStream: %v", err)
	}
	return s
}

// slotName returns a replication slot (and publication) name of its own for one test: slots are cluster-wide,
// and the tests that use them run in parallel.
func slotName() string { return "kwtest_" + strings.ToLower(rand.Text()[:12]) }

func confirmedLSN(t *testing.T, pool *pgxpool.Pool, slot string) string {
	t.Helper()
	var lsn string
	if err := pool.QueryRow(context.Background(), "select coalesce(confirmed_flush_lsn::text, '') from pg_replication_slots where slot_name = $1", slot).Scan(&lsn); err != nil {
		t.Fatalf("read slot: %v", err)
	}
	return lsn
}

// TestStreamDeliversAndResumes: committed changes arrive in order with old and new rows, the slot is created
// with a resync, an apply that fails is retried and not acknowledged meanwhile, and a restarted stream resumes
// from the slot without losing the changes committed while it was down.
func TestStreamDeliversAndResumes(t *testing.T) {
	t.Parallel()
	slot := slotName()
	dsn, pool := streamDB(t, slot)
	ctx := context.Background()
	var mu sync.Mutex
	var resyncs []string
	rec := &recorder{}
	s := newStream(t, dsn, slot, &resyncs, &mu)
	stop := run(t, s, rec.apply)
	testenv.Eventually(t, 10*time.Second, "stream streaming", func() bool { return s.Status().State == "streaming" })
	mu.Lock()
	if got, want := strings.Join(resyncs, ","), stream.ResyncCreated; got != want {
		t.Errorf("resyncs after creating the slot: got %q, want %q", got, want)
	}
	mu.Unlock()

	// A rolled-back transaction never arrives; a move of a row between groups carries both values.
	tx, _ := pool.Begin(ctx)
	_, _ = tx.Exec(ctx, "update item set name = 'rolled back' where id = 1")
	_ = tx.Rollback(ctx)
	for _, q := range []string{
		"update item set name = 'one' where id = 1",
		"update item set grp = 2 where id = 3", // grp 0 → 2
		"delete from item where id = 4",
		"insert into item values (11, 1, 'eleven')",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	testenv.Eventually(t, 10*time.Second, "4 changes applied", func() bool { return len(rec.changes()) == 4 })
	ch := rec.changes()
	if ch[0].Op != 'U' || ch[0].Table != "public.item" || ch[0].New["name"] != "one" {
		t.Errorf("change 1: got %+v, want an update of public.item to name one", ch[0])
	}
	if ch[1].Old["grp"] != "0" || ch[1].New["grp"] != "2" {
		t.Errorf("change 2: got old %v new %v, want grp 0 → 2 (REPLICA IDENTITY FULL sends the old row)", ch[1].Old, ch[1].New)
	}
	if ch[2].Op != 'D' || ch[2].Old["id"] != "4" {
		t.Errorf("change 3: got %+v, want the delete of id 4", ch[2])
	}
	if ch[3].Op != 'I' || ch[3].New["id"] != "11" {
		t.Errorf("change 4: got %+v, want the insert of id 11", ch[3])
	}
	testenv.Eventually(t, 10*time.Second, "acknowledged LSN reaches the slot", func() bool {
		return confirmedLSN(t, pool, slot) == s.Status().AckedLSN
	})

	// Apply fails: the failing commit is not acknowledged, and the change is offered again. The slot may still
	// move (a keepalive for WAL written before the transaction), but never to the end of the failing commit's
	// record. The bound is the End the stream itself received for that transaction: a WAL position read by the
	// test would not do, as other tests' transactions write WAL between it and this commit.
	rec.setFail(errors.New("origin down"))
	if _, err := pool.Exec(ctx, "update item set name = 'retried' where id = 2"); err != nil {
		t.Fatal(err)
	}
	var failing stream.Txn
	testenv.Eventually(t, 10*time.Second, "the failing transaction offered 3 times", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		n := 0
		for _, tx := range rec.failed {
			if len(tx.Changes) == 1 && tx.Changes[0].New["name"] == "retried" {
				failing, n = tx, n+1
			}
		}
		return n >= 3
	})
	got := confirmedLSN(t, pool, slot)
	var passed bool
	if err := pool.QueryRow(ctx, "select $1::pg_lsn >= $2::pg_lsn", got, pglogrepl.LSN(failing.End).String()).Scan(&passed); err != nil {
		t.Fatal(err)
	}
	if passed {
		t.Errorf("confirmed LSN %s reached the end of the failing commit (%s) while apply failed", got, pglogrepl.LSN(failing.End))
	}
	// Stop while failing: the change must come back after a restart.
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := pool.Exec(ctx, "update item set name = 'while down' where id = 5"); err != nil {
		t.Fatal(err)
	}
	rec2 := &recorder{}
	s2 := newStream(t, dsn, slot, &resyncs, &mu)
	run(t, s2, rec2.apply)
	testenv.Eventually(t, 10*time.Second, "both unacknowledged changes redelivered", func() bool { return len(rec2.changes()) == 2 })
	ch = rec2.changes()
	if ch[0].New["name"] != "retried" || ch[1].New["name"] != "while down" {
		t.Errorf("after restart: got %v, %v; want retried, while down", ch[0].New, ch[1].New)
	}
	mu.Lock()
	if len(resyncs) != 1 {
		t.Errorf("resyncs: got %v, want only the first (the slot survived the restart)", resyncs)
	}
	mu.Unlock()
}

// TestStreamRecreatesLostSlot: a slot dropped behind the stream's back (as after max_slot_wal_keep_size
// invalidation, or an operator's mistake) is recreated, Resync is called and the resyncs metric counts it.
func TestStreamRecreatesLostSlot(t *testing.T) {
	t.Parallel()
	slot := slotName()
	dsn, pool := streamDB(t, slot)
	ctx := context.Background()
	resyncs := &resyncLog{}
	reg := prometheus.NewRegistry()
	s, err := stream.New(stream.Config{DSN: dsn, Slot: slot, Publication: slot, Tables: []string{"item"},
		CreatePublication: true, Registerer: reg, Resync: resyncs.resync})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	run(t, s, rec.apply)
	testenv.Eventually(t, 10*time.Second, "streaming", func() bool { return s.Status().State == "streaming" })
	// Kill the walsender and drop the slot before the stream reconnects (its back-off is at least 1 s); the slot
	// may not be marked active yet when the stream says streaming, so try until the drop succeeds.
	testenv.Eventually(t, 10*time.Second, "slot dropped", func() bool {
		_, _ = pool.Exec(ctx, `select pg_terminate_backend(active_pid) from pg_replication_slots where slot_name = $1 and active_pid is not null`, slot)
		_, err := pool.Exec(ctx, "select pg_drop_replication_slot($1)", slot)
		return err == nil
	})
	testenv.Eventually(t, 20*time.Second, "second resync", func() bool { return len(resyncs.all()) == 2 })
	if got := counterValue(t, reg, "keepwarm_stream_resyncs_total", stream.ResyncCreated); got != 2 {
		t.Errorf("keepwarm_stream_resyncs_total{reason=created}: got %v, want 2", got)
	}
	if _, err := pool.Exec(ctx, "update item set name = 'after' where id = 1"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "change after the new slot", func() bool { return len(rec.changes()) == 1 })
	if probs, err := testutil.GatherAndLint(reg); err != nil || len(probs) > 0 {
		t.Errorf("metrics lint: %v %v", probs, err)
	}
}

// counterValue returns the value of counter name{reason=reason} in reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{reason=%q}", name, reason)
	return 0
}

// TestCheckFeeds: unknown tables and columns are errors naming the keyspace; an id column outside the replica
// identity is a warning.
func TestCheckFeeds(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, fmt.Sprintf(`create table %[1]s.a (id int primary key, ref int);
		create table %[1]s.b (id int primary key, ref int); alter table %[1]s.b replica identity full;
		create view %[1]s.v as select * from %[1]s.a;
		create table %[1]s.nokey (id int, ref int)`, schema)); err != nil {
		t.Fatal(err)
	}
	feeds := []stream.FeedColumn{
		{Keyspace: "k1", Table: schema + ".a", Column: "id"},      // ok: the primary key
		{Keyspace: "k2", Table: schema + ".a", Column: "ref"},     // warning: not in the identity
		{Keyspace: "k3", Table: schema + ".b", Column: "ref"},     // ok: FULL
		{Keyspace: "k4", Table: schema + ".a", Column: "nope"},    // error
		{Keyspace: "k5", Table: schema + ".missing", Column: "x"}, // error
		{Keyspace: "k6", Table: schema + ".v", Column: "id"},      // error: a view
		{Keyspace: "k7", Table: schema + ".nokey", Column: "id"},  // error: no replica identity
	}
	warnings, err := stream.CheckFeeds(ctx, pool, feeds)
	if err == nil {
		t.Fatal("CheckFeeds: got no error, want four")
	}
	for _, want := range []string{`keyspace "k4": fed_by: table ` + schema + `.a has no column "nope"`,
		`keyspace "k5": fed_by: table ` + schema + `.missing does not exist`, `keyspace "k6"`,
		`keyspace "k7": fed_by: table ` + schema + `.nokey has no replica identity`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if len(warnings) != 1 || warnings[0].Keyspace != "k2" || warnings[0].Identity != "DEFAULT" {
		t.Errorf("warnings: got %+v, want one for k2 (REPLICA IDENTITY DEFAULT)", warnings)
	}
}

// TestStreamPartitionedTable: a fed table that is partitioned, in a publication created without
// publish_via_partition_root. Its changes arrive under the root's name (the stream turns the option on), and a
// restart finds the table published
// (through pg_publication_rel: pg_publication_tables lists the partitions) instead of failing on ALTER
// PUBLICATION … ADD TABLE with 42710, "already member", which stopped the daemon.
func TestStreamPartitionedTable(t *testing.T) {
	t.Parallel()
	slot := slotName()
	dsn, pool := streamDB(t, slot)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `create table part (id int, grp int, name text, primary key (id, grp)) partition by list (grp);
		create table part_0 partition of part for values in (0);
		create table part_1 partition of part for values in (1, 2);
		alter table part_0 replica identity full;
		alter table part_1 replica identity full;
		insert into part select g, g % 3, 'part ' || g from generate_series(1, 10) g`); err != nil {
		t.Fatalf("create partitioned table: %v", err)
	}
	// The publication as keepwarm created it before: without publish_via_partition_root. The stream turns it on.
	if _, err := pool.Exec(ctx, "create publication "+slot+" for table part"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "drop publication if exists "+slot) })
	start := func() (*recorder, func() error) {
		s, err := stream.New(stream.Config{DSN: dsn, Slot: slot, Publication: slot,
			Tables: []string{"part"}, CreatePublication: true, Gather: -1, StatusInterval: time.Second,
			Resync: func(context.Context, string) error { return nil }})
		if err != nil {
			t.Fatalf("NewStream: %v", err)
		}
		rec := &recorder{}
		stop := run(t, s, rec.apply)
		testenv.Eventually(t, 10*time.Second, "stream streaming", func() bool { return s.Status().State == "streaming" })
		return rec, stop
	}
	for round := 1; round <= 2; round++ { // the second round is the restart
		rec, stop := start()
		name := fmt.Sprintf("round %d", round)
		if _, err := pool.Exec(ctx, "update part set name = $1 where id = 4", name); err != nil { // grp 1: in part_1
			t.Fatal(err)
		}
		// The previous round's change may come again first (delivery is at least once: its acknowledgement may not
		// have reached the slot before the stop).
		var ch stream.Change
		testenv.Eventually(t, 10*time.Second, name+": the update arrives", func() bool {
			for _, c := range rec.changes() {
				if c.New["name"] == name {
					ch = c
					return true
				}
			}
			return false
		})
		if ch.Table != "public.part" {
			t.Errorf("%s: got the change under %s, want public.part (the root, which fed_by names)", name, ch.Table)
		}
		if err := stop(); err != nil {
			t.Fatalf("%s: Run: %v", name, err)
		}
	}
}

// TestStreamFollowsATableRebuild: a migration rebuilds the fed table the online way (create a new
// table, copy, drop the old one, rename): the publication silently lost it, and the stream went on "streaming"
// nothing. The publication watch notices within PublicationCheck, the next session adds the table back and
// resyncs (changes made while it was unpublished were never streamed), and later updates arrive again. Without
// create_publication the table is reported as unpublished instead, and the stream keeps running.
func TestStreamFollowsATableRebuild(t *testing.T) {
	t.Parallel()
	for _, create := range []bool{true, false} {
		t.Run(fmt.Sprintf("create_publication=%v", create), func(t *testing.T) {
			slot := slotName()
			dsn, pool := streamDB(t, slot)
			ctx := context.Background()
			if !create {
				if _, err := pool.Exec(ctx, "create publication "+slot+" for table item"); err != nil {
					t.Fatal(err)
				}
			}
			resyncs := &resyncLog{}
			s, err := stream.New(stream.Config{DSN: dsn, Slot: slot, Publication: slot,
				Tables: []string{"item"}, CreatePublication: create, Gather: -1, StatusInterval: time.Second,
				PublicationCheck: 100 * time.Millisecond, Resync: resyncs.resync})
			if err != nil {
				t.Fatal(err)
			}
			rec := &recorder{}
			run(t, s, rec.apply)
			testenv.Eventually(t, 10*time.Second, "stream streaming", func() bool { return s.Status().State == "streaming" })
			if _, err := pool.Exec(ctx, `create table item_new (like item including all);
				insert into item_new select * from item;
				alter table item_new replica identity full;
				drop table item;
				alter table item_new rename to item;
				update item set name = 'while unpublished' where id = 1`); err != nil {
				t.Fatalf("rebuild: %v", err)
			}
			if !create {
				// Reported, and the stream goes on (after the resync the changed OID asks for): no fatal error.
				testenv.Eventually(t, 10*time.Second, "the table reported unpublished, and streaming", func() bool {
					st := s.Status()
					return slices.Equal(st.Unpublished, []string{"public.item"}) && st.State == "streaming"
				})
				return
			}
			testenv.Eventually(t, 10*time.Second, "resynced after the table was added back", func() bool {
				return slices.Contains(resyncs.all(), stream.ResyncPublication)
			})
			testenv.Eventually(t, 10*time.Second, "streaming again", func() bool { return s.Status().State == "streaming" })
			if _, err := pool.Exec(ctx, "update item set name = 'after the rebuild' where id = 2"); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 10*time.Second, "an update after the rebuild arrives", func() bool {
				for _, c := range rec.changes() {
					if c.New["name"] == "after the rebuild" {
						return true
					}
				}
				return false
			})
		})
	}
}

// TestStreamBoundsATransaction: rows keep only the mapped columns (Config.Columns), and a
// transaction above MaxTxnChanges is delivered empty, marked Overflowed, after a resync of every hot key, instead
// of being held in memory whole (a 300,000-row UPDATE took the daemon to 374-561 MiB). The rows it changed are
// still counted as received.
func TestStreamBoundsATransaction(t *testing.T) {
	t.Parallel()
	slot := slotName()
	dsn, pool := streamDB(t, slot)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "insert into item select g, g % 3, 'item ' || g from generate_series(11, 3000) g"); err != nil {
		t.Fatal(err)
	}
	resyncs := &resyncLog{}
	s, err := stream.New(stream.Config{DSN: dsn, Slot: slot, Publication: slot,
		Tables: []string{"item"}, CreatePublication: true, Gather: -1, StatusInterval: time.Second,
		Columns: map[string][]string{"item": {"grp"}}, MaxTxnChanges: 1000, Resync: resyncs.resync})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	run(t, s, rec.apply)
	testenv.Eventually(t, 10*time.Second, "stream streaming", func() bool { return s.Status().State == "streaming" })
	if _, err := pool.Exec(ctx, "update item set name = 'small' where id = 1"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "update item set name = name || '!'"); err != nil { // 3,000 rows in one transaction
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "update item set name = 'after' where id = 2"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "three transactions applied", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.txns) == 3
	})
	rec.mu.Lock()
	txns := slices.Clone(rec.txns)
	rec.mu.Unlock()
	if len(txns[0].Changes) != 1 || !maps.Equal(txns[0].Changes[0].New, map[string]string{"grp": "1"}) {
		t.Errorf("the small update: %+v; want one change carrying only grp (the mapped column)", txns[0].Changes)
	}
	if !txns[1].Overflowed || len(txns[1].Changes) != 0 {
		t.Errorf("the 3,000-row transaction: overflowed %v with %d changes kept; want overflowed with none", txns[1].Overflowed, len(txns[1].Changes))
	}
	if txns[2].Overflowed || len(txns[2].Changes) != 1 {
		t.Errorf("the update after it: overflowed %v, %d changes; want 1 change", txns[2].Overflowed, len(txns[2].Changes))
	}
	if got := resyncs.all(); !slices.Contains(got, stream.ResyncLargeTransaction) {
		t.Errorf("resyncs %v; want one for the large transaction", got)
	}
	if got := s.Status().Received; got != 3002 {
		t.Errorf("changes received: %d, want 3,002 (every row of the large transaction counted, kept or not)", got)
	}
}

// owedMap is an OwedStore in memory, standing in for the daemon's Redis set (stream.OwedResyncs, tested on Redis
// in the warmer package): what a killed process leaves there is what the next one reads.
type owedMap struct {
	mu      sync.Mutex
	reasons []string
}

func (o *owedMap) Load(context.Context) ([]string, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.reasons), nil
}

func (o *owedMap) Save(_ context.Context, r []string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.reasons = slices.Clone(r)
	return nil
}

// TestStreamOwedResyncSurvivesACrash: a stream creates its slot and dies before its resync finished
// (here: the resync keeps failing until the process is stopped, as a kill -9 would leave it). The next stream
// finds the slot already there, so nothing but the owed record tells it that changes before the slot were never
// seen: it resyncs, then clears the record. Before, the resync owed lived in memory only: 60 of 60 updated hot
// tracks kept their old values.
func TestStreamOwedResyncSurvivesACrash(t *testing.T) {
	t.Parallel()
	slot := slotName()
	dsn, _ := streamDB(t, slot)
	owed := &owedMap{}
	resyncs := &resyncLog{}
	fail := atomic.Bool{}
	fail.Store(true)
	newS := func() *stream.Stream {
		s, err := stream.New(stream.Config{DSN: dsn, Slot: slot, Publication: slot,
			Tables: []string{"item"}, CreatePublication: true, Gather: -1, StatusInterval: time.Second, Owed: owed,
			Resync: func(ctx context.Context, reason string) error {
				if fail.Load() {
					return errors.New("killed before the resync finished")
				}
				return resyncs.resync(ctx, reason)
			}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	stop := run(t, newS(), (&recorder{}).apply)
	testenv.Eventually(t, 10*time.Second, "the slot created and its resync recorded as owed", func() bool {
		r, _ := owed.Load(context.Background())
		return slices.Equal(r, []string{stream.ResyncCreated})
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	fail.Store(false)
	s2 := newS()
	run(t, s2, (&recorder{}).apply)
	testenv.Eventually(t, 10*time.Second, "the second stream streaming", func() bool { return s2.Status().State == "streaming" })
	if got := resyncs.all(); !slices.Equal(got, []string{stream.ResyncCreated}) {
		t.Errorf("resyncs of the second stream: %v, want the one owed (%s) although its slot existed", got, stream.ResyncCreated)
	}
	if r, _ := owed.Load(context.Background()); len(r) != 0 {
		t.Errorf("owed after the resync: %v, want none", r)
	}
}

// resyncLog is a Config.Resync that records each reason it is called with.
type resyncLog struct {
	mu      sync.Mutex
	reasons []string
}

func (r *resyncLog) resync(_ context.Context, reason string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reasons = append(r.reasons, reason)
	return nil
}

func (r *resyncLog) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.reasons)
}
