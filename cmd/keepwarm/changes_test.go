package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// TestRunChangeStreamRefreshesOnCommit: `keepwarm run` with [changes] on rebuilds a cached key within seconds of
// the commit that changed its row (a key an app cached for an hour, not hot: nothing else would rebuild it), and
// leaves an uncached id alone. Its slot and publication are dropped on cleanup.
func TestRunChangeStreamRefreshesOnCommit(t *testing.T) {
	f := newDaemonFixture(t)
	rdb := testenv.Redis(t)
	pool := testenv.Postgres(t)
	ctx := context.Background()
	name := fmt.Sprintf("kwtest_%d", time.Now().UnixNano()%1e12)
	table := strings.ReplaceAll(f.table, `"`, "")
	t.Cleanup(func() {
		testenv.Poll(15*time.Second, func() bool {
			_, err := pool.Exec(ctx, "select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = $1", name)
			return err == nil
		})
		_, _ = pool.Exec(ctx, "drop publication if exists "+name)
	})
	if _, err := pool.Exec(ctx, "alter table "+f.table+" add primary key (id)"); err != nil { // a replica identity
		t.Fatal(err)
	}
	f.write(t, `"1"`, fmt.Sprintf(`fed_by = [{ table = %q, id = "id" }]
[changes]
enabled = true
slot = %q
publication = %q
lease_ttl = "2s"`, table, name, name))
	logs, stop := startRun(t, f.path)
	key := func(id string) string { return f.prefix + "item:" + id }
	waitFor(t, 10*time.Second, "pinned id 1 written and the stream started", func() bool {
		return rdb.Exists(ctx, key("1")).Val() == 1 && strings.Contains(logs.String(), "change stream started")
	}, logs)
	if err := rdb.Set(ctx, key("2"), "old", time.Hour).Err(); err != nil { // as an app's miss path would
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "update "+f.table+` set body = '{"v": "changed"}' where id in ('2', '5')`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the change in Redis", func() bool {
		return strings.Contains(rdb.Get(ctx, key("2")).Val(), `"changed"`)
	}, logs)
	if n := rdb.Exists(ctx, key("5")).Val(); n != 0 {
		t.Errorf("uncached id 5: exists %d, want 0 (changes leave uncached ids alone)", n)
	}
	if code := stop(); code != 0 {
		t.Errorf("exit code %d, want 0\n%s", code, logs)
	}
}
