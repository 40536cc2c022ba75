package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keepwarm/keepwarm/internal/pgserver"
	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/sources/postgres"
)

// heldCommit starts an UPDATE on pg whose commit waits for a synchronous standby that never answers
// (synchronous_standby_names = 'nobody', the writer's synchronous_commit on), and returns its 32-bit xid, an LSN at or
// past its commit record's end, and a function that releases the standby and returns the writer's error.
func heldCommit(t *testing.T, pg *pgserver.Server) (xid uint32, end uint64, release func() error) {
	t.Helper()
	ctx := context.Background()
	if err := pg.Exec(ctx, "postgres", "create table if not exists t (id int primary key, v int); insert into t values (1, 0) on conflict do nothing"); err != nil {
		t.Fatal(err)
	}
	if err := pg.Reload(ctx, map[string]string{"synchronous_standby_names": "nobody"}); err != nil {
		t.Fatal(err)
	}
	writer, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	tx, err := writer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var x8 int64
	if err := tx.QueryRow(ctx, "update t set v = v + 1 where id = 1 returning pg_current_xact_id()::text::int8").Scan(&x8); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "set local synchronous_commit = on"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- tx.Commit(ctx) }()
	t.Cleanup(func() {
		// A test that failed before its release: let the commit through, then close the writer.
		_ = pg.Reload(context.Background(), map[string]string{"synchronous_standby_names": ""})
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
		writer.Close(context.Background())
	})
	reader, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reader.Close(context.Background()) })
	testenv.Eventually(t, 10*time.Second, "the commit waits for the standby (SyncRep)", func() bool {
		var n int
		return reader.QueryRow(ctx, "select count(*) from pg_stat_activity where wait_event = 'SyncRep'").Scan(&n) == nil && n == 1
	})
	var lsn string
	if err := reader.QueryRow(ctx, "select pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	l, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(x8), uint64(l), func() error {
		if err := pg.Reload(ctx, map[string]string{"synchronous_standby_names": ""}); err != nil {
			return err
		}
		err := <-done
		done <- err // for the cleanup
		return err
	}
}

func visibleSource(t *testing.T, dsn string) *postgres.Source {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return newSource(t, pool, postgres.Config{Keyspace: "t", Query: "select id::text, v::text from t where id::text = any($1)"})
}

// TestWaitVisibleOnAPrimary: a commit held by synchronous replication is committed in the commit log but not
// visible; WaitVisible must wait (here until its context's deadline) and return once the commit is released,
// saying when it last saw it not visible. The cluster's transaction ids are in epoch 3, so a 32-bit xid widened to
// the wrong epoch would read as long committed, and visible.
func TestWaitVisibleOnAPrimary(t *testing.T) {
	t.Parallel()
	pg := testenv.PrivatePostgres(t, pgserver.Options{XidEpoch: 3})
	src := visibleSource(t, pg.DSN("postgres"))
	xid, end, release := heldCommit(t, pg)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	last, err := src.WaitVisible(ctx, []uint32{xid}, []uint64{end})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitVisible on a held commit: err %v, want context.DeadlineExceeded", err)
	}
	if len(last) != 1 || last[0].IsZero() {
		t.Errorf("last seen not visible: %v, want a time", last)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type result struct {
		last []time.Time
		err  error
	}
	got := make(chan result, 1)
	go func() {
		l, err := src.WaitVisible(ctx, []uint32{xid}, []uint64{end})
		got <- result{l, err}
	}()
	released := time.Now()
	if err := release(); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("WaitVisible after the release: %v", r.err)
	}
	t.Logf("visible %v after the release", time.Since(released).Round(time.Millisecond))
	if r.last[0].After(time.Now()) {
		t.Errorf("last seen not visible %v is in the future", r.last[0])
	}
	// A transaction visible at the first look has no "last seen not visible" time.
	last, err = src.WaitVisible(context.Background(), []uint32{xid}, []uint64{end})
	if err != nil || len(last) != 1 || !last[0].IsZero() {
		t.Errorf("WaitVisible of a visible commit: %v, %v; want one zero time, nil", last, err)
	}
}

// TestWaitVisibleOnAReplica: on a read replica, a commit is visible once the replica has replayed it.
func TestWaitVisibleOnAReplica(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.PrivatePostgres(t, pgserver.Options{})
	sb, err := pg.AddStandby(ctx, pgserver.StandbyOptions{Name: "kwreplica"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sb.Remove)
	src := visibleSource(t, sb.DSN("postgres"))
	if err := pg.Exec(ctx, "postgres", "create table t (id int primary key, v int)"); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var x8 int64
	var lsn string
	if err := conn.QueryRow(ctx, "insert into t values (1, 1) returning pg_current_xact_id()::text::int8").Scan(&x8); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "select pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	l, _ := pglogrepl.ParseLSN(lsn)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := src.WaitVisible(wctx, []uint32{uint32(x8)}, []uint64{uint64(l)}); err != nil {
		t.Fatalf("WaitVisible on the replica: %v", err)
	}
	var v int
	if err := pgxConnQuery(t, sb.DSN("postgres"), "select v from t where id = 1", &v); err != nil || v != 1 {
		t.Errorf("the row on the replica after WaitVisible: %d, %v; want 1", v, err)
	}
	// An LSN the replica has not replayed (far ahead of the primary's WAL) is not visible.
	sctx, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer scancel()
	if _, err := src.WaitVisible(sctx, []uint32{uint32(x8)}, []uint64{uint64(l) + 1<<40}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitVisible of an LSN not replayed: %v, want context.DeadlineExceeded", err)
	}
}

func pgxConnQuery(t *testing.T, dsn, q string, dst any) error {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(context.Background(), q).Scan(dst)
}
