package pgserver_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keepwarm/keepwarm/internal/pgserver"
	"github.com/keepwarm/keepwarm/internal/testenv"
)

// TestSynchronousStandby checks what the change stream's tests rely on: a synchronous standby replicates a commit,
// and while synchronous_standby_names names a standby that never answers, a commit waits (and is not visible to
// other sessions) until the setting is cleared.
func TestSynchronousStandby(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.PrivatePostgres(t, pgserver.Options{})
	sb, err := pg.AddStandby(ctx, pgserver.StandbyOptions{Name: "kwstandby", Sync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sb.Remove)
	if err := pg.Exec(ctx, "postgres", "create table t (id int primary key, v text); insert into t values (1, 'a')"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the standby replays the insert", func() bool {
		conn, err := pgx.Connect(ctx, sb.DSN("postgres"))
		if err != nil {
			return false
		}
		defer conn.Close(ctx)
		var v string
		return conn.QueryRow(ctx, "select v from t where id = 1").Scan(&v) == nil && v == "a"
	})

	if err := pg.Reload(ctx, map[string]string{"synchronous_standby_names": "nobody"}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- pg.Exec(ctx, "postgres", "update t set v = 'b' where id = 1") }()
	reader, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close(ctx)
	// The writer's commit record is flushed and its backend waits for the standby: wait for that state.
	testenv.Eventually(t, 10*time.Second, "the writer waits for synchronous replication", func() bool {
		var n int
		err := reader.QueryRow(ctx, "select count(*) from pg_stat_activity where wait_event = 'SyncRep'").Scan(&n)
		return err == nil && n == 1
	})
	var v string
	if err := reader.QueryRow(ctx, "select v from t where id = 1").Scan(&v); err != nil || v != "a" {
		t.Fatalf("while the commit waits: v = %q (%v), want the old value \"a\"", v, err)
	}
	if err := pg.Reload(ctx, map[string]string{"synchronous_standby_names": "kwstandby"}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal(errors.New("the commit still waits 30 s after the standby was named again"))
	}
	if err := reader.QueryRow(ctx, "select v from t where id = 1").Scan(&v); err != nil || v != "b" {
		t.Fatalf("after the release: v = %q (%v), want \"b\"", v, err)
	}
}
