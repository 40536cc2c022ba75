package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keepwarm/keepwarm/internal/pgserver"
	"github.com/keepwarm/keepwarm/internal/testenv"
)

// metricValue reads one series from the daemon's /metrics: the line that starts with series (name and labels
// exactly as exposed), 0 when there is none.
func metricValue(t *testing.T, addr, series string) float64 {
	t.Helper()
	for _, line := range strings.Split(metricsBody(t, addr), "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, _ := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v
		}
	}
	return 0
}

// TestChangeWaitsUntilItsCommitIsVisible: PostgreSQL streams a commit as soon as its WAL is flushed, while its
// backend still waits for a synchronous standby (Patroni and most HA set-ups), and the row is not visible to other
// sessions meanwhile. With synchronous_standby_names naming a standby that never answers, the daemon receives the
// change of a cached key (TTL an hour, not hot: nothing else would rebuild it). It must not rebuild the key from
// the old row and acknowledge the change: while the commit is held, the slot's confirmed LSN stays before it and
// the key keeps its value; once the standby is released, the key gets the new row and the LSN moves on. Without
// the visibility wait, the daemon re-read the old row at once, acknowledged, and the key kept the old value for its
// whole TTL.
func TestChangeWaitsUntilItsCommitIsVisible(t *testing.T) {
	// Serial: `keepwarm run` sets go-redis's process-wide logger (routeRedisLogs).
	ctx := context.Background()
	pg := testenv.PrivatePostgres(t, pgserver.Options{})
	f := newPrivateDaemonFixture(t, pg)
	rdb := testenv.Redis(t)
	name := fmt.Sprintf("kwvis_%d", time.Now().UnixNano()%1e12)
	dropStreamKeys(t, name)
	f.write(t, `"1"`, fmt.Sprintf(`fed_by = [{ table = "public.items", id = "id" }]
[changes]
enabled = true
slot = %q
publication = %q
lease_ttl = "2s"
visibility_timeout = "1s"`, name, name))
	logs, stop := startRun(t, f.path)
	addr := listenAddr(t, logs)
	key := func(id string) string { return f.prefix + "item:" + id }
	testenv.EventuallyDiag(t, 15*time.Second, "pinned id 1 written and the stream started", withLog(logs, func() bool {
		return rdb.Exists(ctx, key("1")).Val() == 1 && strings.Contains(logs.String(), "change stream started")
	}))
	if err := rdb.Set(ctx, key("2"), "old", time.Hour).Err(); err != nil { // as an app's miss path would
		t.Fatal(err)
	}

	if err := pg.Reload(ctx, map[string]string{"synchronous_standby_names": "nobody"}); err != nil {
		t.Fatal(err)
	}
	writer, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close(ctx)
	if _, err := writer.Exec(ctx, "set synchronous_commit = on"); err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() {
		_, err := writer.Exec(ctx, `update public.items set body = '{"v": "changed"}' where id = '2'`)
		committed <- err
	}()
	reader, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close(ctx)
	testenv.Eventually(t, 10*time.Second, "the writer's commit waits for the standby (SyncRep)", func() bool {
		var n int
		return reader.QueryRow(ctx, "select count(*) from pg_stat_activity where wait_event = 'SyncRep'").Scan(&n) == nil && n == 1
	})
	var held string // at or past the held commit's end
	if err := reader.QueryRow(ctx, "select pg_current_wal_insert_lsn()::text").Scan(&held); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyDiag(t, 15*time.Second, "the daemon received the change", withLog(logs, func() bool {
		return metricValue(t, addr, "keepwarm_stream_changes_received_total") >= 1
	}))
	// Then either it acknowledges the change (wrong: the new row is not visible) or its visibility wait times out,
	// twice (it waits, retries, and does not acknowledge).
	ackedHeld := func() bool {
		var acked bool
		return reader.QueryRow(ctx, "select confirmed_flush_lsn >= $1::pg_lsn from pg_replication_slots where slot_name = $2",
			held, name).Scan(&acked) == nil && acked
	}
	timeouts := `keepwarm_changes_visibility_timeouts_total{keyspace="items"}`
	testenv.EventuallyDiag(t, 15*time.Second, "the daemon acknowledged the change or waited for it twice", withLog(logs, func() bool {
		return ackedHeld() || metricValue(t, addr, timeouts) >= 2
	}))
	if ackedHeld() {
		t.Errorf("the slot acknowledged the held commit (confirmed_flush_lsn >= %s) before it was visible", held)
	}
	if got := rdb.Get(ctx, key("2")).Val(); got != "old" {
		t.Errorf("key 2 while the commit is held: %q, want \"old\" (nothing visible changed)", got)
	}

	released := time.Now()
	if err := pg.Reload(ctx, map[string]string{"synchronous_standby_names": ""}); err != nil {
		t.Fatal(err)
	}
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyDiag(t, 15*time.Second, "the new row in Redis after the release", withLog(logs, func() bool {
		return strings.Contains(rdb.Get(ctx, key("2")).Val(), `"changed"`)
	}))
	t.Logf("key 2 had the new row %v after the release; late changes counted: %v", time.Since(released).Round(time.Millisecond),
		metricValue(t, addr, `keepwarm_changes_late_total{keyspace="items"}`))
	testenv.Eventually(t, 15*time.Second, "the slot acknowledges the commit", ackedHeld)
	if code := stop(); code != 0 {
		t.Errorf("exit code %d, want 0\n%s", code, logs)
	}
}
