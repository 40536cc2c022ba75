package stream_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keepwarm/keepwarm/internal/pgserver"
	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/sources/postgres/stream"
)

// memoryOwed is an OwedStore and SlotHistory in memory, shared by the streams of one test as the daemons of a
// fleet share Redis.
type memoryOwed struct {
	mu       sync.Mutex
	reasons  []string
	streamed bool
}

func (m *memoryOwed) Load(context.Context) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.reasons), nil
}

func (m *memoryOwed) Save(_ context.Context, r []string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reasons = slices.Clone(r)
	return nil
}

func (m *memoryOwed) Streamed(context.Context) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.streamed, nil
}

func (m *memoryOwed) MarkStreamed(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.streamed = true
	return nil
}

func queryOne(t *testing.T, dsn, q string, dst ...any) error {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(context.Background(), q).Scan(dst...)
}

// TestStreamFailoverSlotSurvivesPromotion (PostgreSQL 17): keepwarm's slot is created as a failover slot, which a
// standby with sync_replication_slots keeps in step. After the primary dies and the standby is promoted, the
// stream resumes from the synchronized slot: no slot is created, nothing is resynced, and a commit on the new
// primary arrives. Without FAILOVER the promoted standby had no slot: created anew, with the changes of the gap
// never seen by any key (cold keys kept them until their TTL).
func TestStreamFailoverSlotSurvivesPromotion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := testenv.PG17BinDir(t)
	primary := testenv.PrivatePostgres(t, pgserver.Options{BinDir: bin, Settings: map[string]string{"hot_standby_feedback": "on"}})
	if primary.Major() != 17 {
		t.Fatalf("server major version %d, want 17", primary.Major())
	}
	standby, err := primary.AddStandby(ctx, pgserver.StandbyOptions{Name: "kwstandby",
		Settings: map[string]string{"sync_replication_slots": "on", "hot_standby_feedback": "on"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(standby.Remove)
	// A logical walsender sends nothing the physical standby has not confirmed: what keepwarm acknowledged exists
	// on the standby after a promotion.
	if err := primary.Reload(ctx, map[string]string{"synchronized_standby_slots": "kwstandby"}); err != nil {
		t.Fatal(err)
	}
	if err := primary.Exec(ctx, "postgres", `create table item (id int primary key, grp int, name text);
		alter table item replica identity full;
		insert into item select g, g % 3, 'item ' || g from generate_series(1, 10) g`); err != nil {
		t.Fatal(err)
	}
	owed := &memoryOwed{}
	resyncs := &resyncLog{}
	start := func(dsn string) (*stream.Stream, *recorder, func() error) {
		s, err := stream.New(stream.Config{DSN: dsn, Slot: "kwfail", Publication: "kwfail",
			Tables: []string{"item"}, CreatePublication: true, Gather: -1, StatusInterval: time.Second,
			Resync: resyncs.resync, Owed: owed})
		if err != nil {
			t.Fatal(err)
		}
		rec := &recorder{}
		stop := run(t, s, rec.apply)
		testenv.Eventually(t, 30*time.Second, "stream streaming", func() bool { return s.Status().State == "streaming" })
		return s, rec, stop
	}
	s, rec, stop := start(primary.DSN("postgres"))
	var failover bool
	if err := queryOne(t, primary.DSN("postgres"), "select failover from pg_replication_slots where slot_name = 'kwfail'", &failover); err != nil || !failover {
		t.Fatalf("the slot on PostgreSQL 17: failover %v (%v), want true", failover, err)
	}
	pool, err := pgxpool.New(ctx, primary.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	sqlExec(t, pool, "update item set name = 'before' where id = 1")
	arrived(t, rec, "before")
	acked := s.Status().AckedLSN
	pool.Close()
	testenv.Eventually(t, 60*time.Second, "the standby's copy of the slot caught up with "+acked, func() bool {
		var ok bool
		return queryOne(t, standby.DSN("postgres"), "select synced and confirmed_flush_lsn >= '"+acked+
			"'::pg_lsn from pg_replication_slots where slot_name = 'kwfail'", &ok) == nil && ok
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := primary.Stop(ctx, "immediate"); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	before := len(resyncs.all())
	_, rec, _ = start(standby.DSN("postgres"))
	pool, err = pgxpool.New(ctx, standby.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	sqlExec(t, pool, "update item set name = 'after the promotion' where id = 2")
	arrived(t, rec, "after the promotion")
	if got := resyncs.all()[before:]; len(got) != 0 {
		t.Errorf("resyncs after the promotion: %v, want none (the synchronized slot resumes where it was)", got)
	}
}
