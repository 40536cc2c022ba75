package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// get returns the status code and body of GET http://addr+path.
func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, string(b)
}

// TestRunStartsWithABrokenKeyspace: a keyspace whose table was renamed (a migration in progress) does not stop
// `keepwarm run`: the healthy keyspace refreshes, /readyz and the status page name the broken one and its error,
// and once the table is back the broken keyspace recovers without a restart.
func TestRunStartsWithABrokenKeyspace(t *testing.T) {
	// Serial: `keepwarm run` sets go-redis's process-wide logger (routeRedisLogs).
	rdb := testenv.Redis(t)
	pool := testenv.Postgres(t)
	prefix := testenv.Prefix(t, rdb)
	schema := testenv.Schema(t, pool)
	ctx := context.Background()
	items := pgx.Identifier{schema, "items"}.Sanitize()
	things := pgx.Identifier{schema, "things"}.Sanitize()
	for _, q := range []string{
		"create table " + items + " as select i::text as id, format('{\"id\": %s}', i)::jsonb as body from generate_series(1, 5) i",
		"create table " + things + " as select i::text as id, 'thing ' || i as body from generate_series(1, 5) i",
		"alter table " + things + " rename to things_renamed", // the migration has renamed it; the config not yet
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	path := filepath.Join(t.TempDir(), "keepwarm.toml")
	cfg := fmt.Sprintf(`
[redis]
url = %q
[postgres]
dsn = %q
statement_timeout = "1s"
[daemon]
listen = "127.0.0.1:0"
log_format = "text"
[[keyspace]]
name = "items"
key = "%[3]sitem:${id}"
ttl = "5s"
refresh_ahead = "1s"
top_n = 0
query = 'select id, body from %[4]s where id = any($1)'
[[keyspace]]
name = "things"
key = "%[3]sthing:${id}"
ttl = "5s"
refresh_ahead = "1s"
top_n = 0
query = 'select id, body from %[5]s where id = any($1)'
[[hotkeys]]
name = "item-pins"
keyspace = "items"
ids = ["1"]
[[hotkeys]]
name = "thing-pins"
keyspace = "things"
ids = ["2"]
`, testenv.RedisURL(), testenv.PostgresURL(), prefix, items, things)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logs, stop := startRun(t, path)
	addr := listenAddr(t, logs)
	testenv.EventuallyDiag(t, 10*time.Second, "the healthy keyspace's pinned key written", withLog(logs, func() bool {
		return rdb.Exists(ctx, prefix+"item:1").Val() == 1
	}))
	if n := rdb.Exists(ctx, prefix+"thing:2").Val(); n != 0 {
		t.Fatalf("the broken keyspace's key exists before its table does")
	}
	// The check of each keyspace runs on its own: wait for the event (the broken one reported), not a time.
	var code int
	var body string
	testenv.EventuallyDiag(t, 10*time.Second, "GET /readyz: 503 naming keyspace \"things\" and its error", withLog(logs, func() bool {
		code, body = get(t, addr, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, `keyspace "things"`) &&
			strings.Contains(body, "does not exist")
	}))
	if strings.Contains(body, `keyspace "items"`) {
		t.Errorf("GET /readyz names the healthy keyspace: %q", body)
	}
	if _, page := get(t, addr, "/"); !strings.Contains(page, "query check failing") || !strings.Contains(page, "things") {
		t.Errorf("status page does not show the failing check of keyspace things:\n%s", page)
	}

	// The migration ends: the table is back under its name. The keyspace recovers without a restart.
	if _, err := pool.Exec(ctx, "alter table "+pgx.Identifier{schema, "things_renamed"}.Sanitize()+" rename to things"); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyDiag(t, 30*time.Second, "the recovered keyspace's pinned key written", withLog(logs, func() bool {
		return rdb.Get(ctx, prefix+"thing:2").Val() == "thing 2"
	}))
	testenv.EventuallyDiag(t, 5*time.Second, "/readyz ready", withLog(logs, func() bool {
		code, _ := get(t, addr, "/readyz")
		return code == http.StatusOK
	}))
	if code := stop(); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0\n%s", code, logs)
	}
}
