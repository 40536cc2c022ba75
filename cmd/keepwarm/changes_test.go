package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// streamName returns a fresh name (prefix_<digits>) for a test's replication slot and publication, and drops both
// when the test ends (the slot once its stream has let it go).
func streamName(t *testing.T, pool *pgxpool.Pool, prefix string) string {
	t.Helper()
	name := fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano()%1e12)
	t.Cleanup(func() {
		ctx := context.Background()
		testenv.Poll(15*time.Second, func() bool {
			_, err := pool.Exec(ctx, "select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = $1", name)
			return err == nil
		})
		_, _ = pool.Exec(ctx, "drop publication if exists "+name)
	})
	return name
}

// TestRunChangeStreamRefreshesOnCommit: `keepwarm run` with [changes] on rebuilds a cached key within seconds of
// the commit that changed its row (a key an app cached for an hour, not hot: nothing else would rebuild it), and
// leaves an uncached id alone. Its slot and publication are dropped on cleanup.
func TestRunChangeStreamRefreshesOnCommit(t *testing.T) {
	f := newDaemonFixture(t)
	rdb := testenv.Redis(t)
	pool := testenv.Postgres(t)
	ctx := context.Background()
	name := streamName(t, pool, "kwtest")
	table := strings.ReplaceAll(f.table, `"`, "")
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

// TestMigrateChanges: `keepwarm migrate up` with the change stream on checks the fed_by tables against the
// catalog (an error naming them when they are missing), creates the publication, and with
// --replica-identity-full sets REPLICA IDENTITY FULL where an id column is not in the identity.
func TestMigrateChanges(t *testing.T) {
	dsn := testenv.Database(t)
	t.Setenv("KEEPWARM_POSTGRES_DSN", dsn)
	_, stderr, code := keepwarm(t, "migrate", "up", "--config", demoConfig)
	if code == 0 || !strings.Contains(stderr, `keyspace "track": fed_by: table public.track does not exist`) {
		t.Fatalf("migrate up without the demo tables: exit %d, stderr %q; want an error naming public.track", code, stderr)
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := context.Background()
	// In public: the first migrate up created schema keepwarm, which comes first in the search path ("$user").
	if _, err := pool.Exec(ctx, `create table public.album (album_id int primary key, title text);
		create table public.track (track_id int primary key, name text, album_id int, genre_id int)`); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := keepwarm(t, "migrate", "up", "--replica-identity-full", "--config", demoConfig)
	if code != 0 {
		t.Fatalf("migrate up: exit %d, stderr %s", code, stderr)
	}
	for _, want := range []string{"changes: publication keepwarm covers [public.track public.album]",
		`changes: alter table "public"."track" replica identity full`} {
		if !strings.Contains(stdout, want) {
			t.Errorf("migrate up: got\n%s\nwant it to contain %q", stdout, want)
		}
	}
	var tables int
	var ident string
	if err := pool.QueryRow(ctx, `select (select count(*) from pg_publication_tables where pubname = 'keepwarm'),
		(select relreplident::text from pg_class where relname = 'track')`).Scan(&tables, &ident); err != nil {
		t.Fatal(err)
	}
	if tables != 2 || ident != "f" {
		t.Errorf("after migrate up: %d published tables, track replica identity %q; want 2 and f", tables, ident)
	}
}
