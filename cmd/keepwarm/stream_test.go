package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keepwarm/keepwarm/internal/assemble"
	"github.com/keepwarm/keepwarm/internal/testenv"
)

// streamName returns a fresh name (prefix_<digits>) for a test's replication slot and publication, and drops both
// when the test ends (the slot once its stream has let it go).
func streamName(t *testing.T, pool *pgxpool.Pool, prefix string) string {
	t.Helper()
	name := fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano()%1e12)
	dropStreamKeys(t, name)
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

// dropStreamKeys deletes, when the test ends, what a change stream of slot keeps in the shared Redis: the lease,
// the resyncs owed and the mark that the slot was streamed from (which has no TTL).
func dropStreamKeys(t *testing.T, slot string) {
	rdb := testenv.Redis(t)
	t.Cleanup(func() {
		key := assemble.LeaseKey(slot)
		_ = rdb.Del(context.Background(), key, key+":resync", key+":resync:streamed").Err()
	})
}

// TestRunChangeStreamRefreshesOnCommit: `keepwarm run` with [changes] on rebuilds a cached key within seconds of
// the commit that changed its row (a key an app cached for an hour, not hot: nothing else would rebuild it), and
// leaves an uncached id alone. Its slot and publication are dropped on cleanup.
func TestRunChangeStreamRefreshesOnCommit(t *testing.T) {
	// Serial: `keepwarm run` sets go-redis's process-wide logger (routeRedisLogs).
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
	testenv.EventuallyDiag(t, 10*time.Second, "pinned id 1 written and the stream started", withLog(logs, func() bool {
		return rdb.Exists(ctx, key("1")).Val() == 1 && strings.Contains(logs.String(), "change stream started")
	}))
	if err := rdb.Set(ctx, key("2"), "old", time.Hour).Err(); err != nil { // as an app's miss path would
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "update "+f.table+` set body = '{"v": "changed"}' where id in ('2', '5')`); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyDiag(t, 5*time.Second, "the change in Redis", withLog(logs, func() bool {
		return strings.Contains(rdb.Get(ctx, key("2")).Val(), `"changed"`)
	}))
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
	// Serial: t.Setenv changes the process environment.
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

// TestValidateCheckDBChecksTheChangeStream: validate --check-db refuses what the change stream would stop on or
// report at run (a publication that does not exist, with create_publication = false, must not pass
// --check-db and then make run exit 1): the missing publication, a publication lacking a feeding table, and a slot of
// another plugin, each named.
func TestValidateCheckDBChecksTheChangeStream(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	dsn := chinookDSN(t)
	t.Setenv("KEEPWARM_POSTGRES_DSN", dsn)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	// A cleanup, not a defer: streamName's cleanup drops the slot with this pool, and cleanups run after defers
	// (with a defer, every run leaked its kwcheck slot: 18 of them filled max_replication_slots and a stream test
	// failed with "all replication slots are in use").
	t.Cleanup(pool.Close)
	name := streamName(t, pool, "kwcheck")
	text, err := os.ReadFile(demoConfig)
	if err != nil {
		t.Fatal(err)
	}
	hotkeys, err := filepath.Abs("../../examples/hotkeys/black-friday.txt")
	if err != nil {
		t.Fatal(err)
	}
	cfgWith := func(slot, publication string) string {
		s := strings.Replace(string(text), `create_publication = true `, `create_publication = false`, 1)
		s = strings.Replace(s, `slot = "keepwarm" `, `slot = "`+slot+`"`, 1)
		s = strings.Replace(s, `publication = "keepwarm" `, `publication = "`+publication+`"`, 1)
		p := filepath.Join(t.TempDir(), "config.toml")
		if err := os.WriteFile(p, []byte(strings.Replace(s, `file = "examples/hotkeys/black-friday.txt"`,
			`file = "`+hotkeys+`"`, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// No publication of that name; a slot of that name made by another plugin.
	if _, err := pool.Exec(context.Background(), "select pg_create_logical_replication_slot($1, 'test_decoding')", name); err != nil {
		t.Fatalf("create a test_decoding slot: %v", err)
	}
	_, stderr, code := keepwarm(t, "validate", "--config", cfgWith(name, name), "--check-db")
	for _, want := range []string{
		`changes: postgres: publication "` + name + `" does not exist and [changes] create_publication is false`,
		`postgres: slot "` + name + `" uses plugin "test_decoding", not pgoutput`,
	} {
		if code != 1 || !strings.Contains(stderr, want) {
			t.Errorf("validate --check-db: exit %d, want 1 and stderr containing %q; stderr:\n%s", code, want, stderr)
		}
	}
	// A publication that lacks a feeding table.
	if _, err := pool.Exec(context.Background(), "create publication "+name+" for table public.track"); err != nil {
		t.Fatal(err)
	}
	_, stderr, code = keepwarm(t, "validate", "--config", cfgWith(name+"_slot", name), "--check-db")
	if want := `public.album: not in publication "` + name + `"`; code != 1 || !strings.Contains(stderr, want) {
		t.Errorf("validate --check-db: exit %d, want 1 and stderr containing %q; stderr:\n%s", code, want, stderr)
	}
}
