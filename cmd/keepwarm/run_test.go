package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keepwarm/keepwarm/internal/pgserver"
	"github.com/keepwarm/keepwarm/internal/testenv"
)

// syncBuffer collects a daemon's log output.
type syncBuffer = testenv.LogBuffer

// daemonConfig writes a config for one keyspace over a fresh table in the test database, with the given
// pinned ids, to dir/keepwarm.toml.
type daemonFixture struct {
	dir, path, prefix, table string
	dsn                      string // the PostgreSQL the config names; "" is the shared one (testenv.PostgresURL)
}

// newPrivateDaemonFixture is newDaemonFixture on a private PostgreSQL cluster (testenv.PrivatePostgres): its
// items table is public.items there, with a primary key (a replica identity).
func newPrivateDaemonFixture(t *testing.T, pg *pgserver.Server) *daemonFixture {
	t.Helper()
	rdb := testenv.Redis(t)
	f := &daemonFixture{dir: t.TempDir(), prefix: testenv.Prefix(t, rdb), dsn: pg.DSN("postgres"), table: "public.items"}
	f.path = filepath.Join(f.dir, "keepwarm.toml")
	if err := pg.Exec(context.Background(), "postgres", "create table public.items (id text primary key, body jsonb); "+
		"insert into public.items select i::text, format('{\"id\": %s}', i)::jsonb from generate_series(1, 20) i"); err != nil {
		t.Fatal(err)
	}
	return f
}

func newDaemonFixture(t *testing.T) *daemonFixture {
	t.Helper()
	rdb := testenv.Redis(t)
	pool := testenv.Postgres(t)
	f := &daemonFixture{dir: t.TempDir(), prefix: testenv.Prefix(t, rdb)}
	f.path = filepath.Join(f.dir, "keepwarm.toml")
	schema := testenv.Schema(t, pool)
	f.table = pgx.Identifier{schema, "items"}.Sanitize()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "create table "+f.table+" as select i::text as id, format('{\"id\": %s}', i)::jsonb as body from generate_series(1, 20) i"); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *daemonFixture) write(t *testing.T, pinned string, extra string) {
	t.Helper()
	f.writeText(t, f.text(pinned, extra))
}

// text is the config write writes: extra goes at the end of the [[keyspace]] table, the [[hotkeys]] list comes
// last.
func (f *daemonFixture) text(pinned string, extra string) string {
	return fmt.Sprintf(`
[redis]
url = %q
[postgres]
dsn = %q
statement_timeout = "500ms"
pool_wait_timeout = "300ms"
[daemon]
listen = "127.0.0.1:0"
log_format = "text"
[[keyspace]]
name = "items"
key = "%sitem:${id}"
ttl = "2s"
refresh_ahead = "600ms"
lock_ttl = "3s"
top_n = 0
query = 'select id, body from %s where id = any($1)'
%s
[[hotkeys]]
name = "pins"
keyspace = "items"
ids = [%s]
`, testenv.RedisURL(), f.postgresURL(), f.prefix, f.table, extra, pinned)
}

func (f *daemonFixture) postgresURL() string {
	if f.dsn != "" {
		return f.dsn
	}
	return testenv.PostgresURL()
}

// writeText writes cfg to a temp file and renames it over the config, as editors and deploy tools do.
func (f *daemonFixture) writeText(t *testing.T, cfg string) {
	t.Helper()
	tmp := f.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, f.path); err != nil {
		t.Fatal(err)
	}
}

// startRun runs `keepwarm run` in-process until the returned stop is called; stop returns the exit code.
func startRun(t *testing.T, path string) (logs *syncBuffer, stop func() int) {
	t.Helper()
	return startRunLoggingTo(t, path, nil)
}

// startRunLoggingTo is startRun with the daemon's output also written to also, when not nil (a log file).
func startRunLoggingTo(t *testing.T, path string, also io.Writer) (logs *syncBuffer, stop func() int) {
	t.Helper()
	logs = &syncBuffer{}
	var out io.Writer = logs
	if also != nil {
		out = io.MultiWriter(logs, also)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		err := run(ctx, []string{"run", "--config", path}, out, out)
		done <- exitCode(err, logs)
	}()
	var once sync.Once
	code := -1
	stop = func() int {
		once.Do(func() {
			cancel()
			select {
			case code = <-done:
			case <-time.After(20 * time.Second):
				t.Error("keepwarm run did not exit 20 s after SIGTERM")
			}
		})
		return code
	}
	t.Cleanup(func() { stop() })
	return logs, stop
}

func TestRunReloadAddsPinnedIDAndSurvivesBadEdit(t *testing.T) {
	// Serial: `keepwarm run` sets go-redis's process-wide logger (routeRedisLogs).
	f := newDaemonFixture(t)
	rdb := testenv.Redis(t)
	ctx := context.Background()
	key := func(id string) string { return f.prefix + "item:" + id }
	f.write(t, `"1"`, "")
	logs, stop := startRun(t, f.path)
	testenv.EventuallyDiag(t, 5*time.Second, "pinned id 1 written", withLog(logs, func() bool {
		return rdb.Exists(ctx, key("1")).Val() == 1
	}))

	// Add a pinned id by write-to-temp-then-rename: it must get warm (after the watcher's 1 s quiet period).
	f.write(t, `"1", "7"`, "")
	testenv.EventuallyDiag(t, 10*time.Second, "id 7 written after the reload", withLog(logs, func() bool {
		return rdb.Exists(ctx, key("7")).Val() == 1
	}))

	// An invalid edit: the daemon keeps its config, logs the problem, and goes on refreshing.
	// It is reported once it stayed invalid for a second quiet period.
	f.write(t, `"1", "7"`, `ttl_typo = "5s"`)
	testenv.EventuallyDiag(t, 10*time.Second, "invalid reload logged", withLog(logs, func() bool {
		return strings.Contains(logs.String(), "config reload rejected") && strings.Contains(logs.String(), "ttl_typo")
	}))
	for i := 0; i < 3; i++ { // three TTLs: the keys stay warm on the last good config
		time.Sleep(2 * time.Second)
		if n := rdb.Exists(ctx, key("1"), key("7")).Val(); n != 2 {
			t.Fatalf("after the bad edit, %d of 2 pinned keys present: the daemon stopped refreshing\n%s", n, logs)
		}
	}
	if code := stop(); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0\n%s", code, logs)
	}
	if locks := rdb.Keys(ctx, "lock:"+f.prefix+"*").Val(); len(locks) != 0 {
		t.Errorf("locks left after shutdown: %v", locks)
	}
}

func TestRunServesHealthAndHotkeys(t *testing.T) {
	// Serial: `keepwarm run` sets go-redis's process-wide logger (routeRedisLogs).
	f := newDaemonFixture(t)
	f.write(t, `"3"`, "")
	logs, _ := startRun(t, f.path)
	addr := listenAddr(t, logs)
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/debug/hotkeys"} {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %s", path, resp.Status)
		}
	}
	var out bytes.Buffer
	testenv.EventuallyDiag(t, 5*time.Second, "status shows the pinned key", withLog(logs, func() bool {
		out.Reset()
		if err := run(context.Background(), []string{"status", "--addr", addr}, &out, &out); err != nil {
			return false
		}
		return strings.Contains(out.String(), f.prefix+"item:3") && strings.Contains(out.String(), "pinned")
	}))
}

// listenAddr reads the daemon's bound address from its "keepwarm running" log line.
func listenAddr(t *testing.T, logs *syncBuffer) string {
	t.Helper()
	var addr string
	testenv.EventuallyDiag(t, 10*time.Second, "daemon listening", withLog(logs, func() bool {
		i := strings.Index(logs.String(), "keepwarm running")
		if i < 0 {
			return false
		}
		line := logs.String()[i:]
		j := strings.Index(line, "listen=")
		if j < 0 {
			return false
		}
		addr = strings.Fields(line[j+len("listen="):])[0]
		return true
	}))
	return addr
}

// TestRunReloadsConfigMapSwap runs the daemon on a Kubernetes ConfigMap volume (keepwarm.toml ->
// ..data/keepwarm.toml, ..data -> ..<version>) and publishes a new version the way the kubelet does: the
// daemon reloads and warms the newly pinned id. It used to watch only the symlink's name and never reload.
func TestRunReloadsConfigMapSwap(t *testing.T) {
	// Serial: `keepwarm run` sets go-redis's process-wide logger (routeRedisLogs).
	f := newDaemonFixture(t)
	rdb := testenv.Redis(t)
	ctx := context.Background()
	cm := t.TempDir()
	current := ""
	publish := func(version, pinned string) {
		t.Helper()
		f.write(t, pinned, "")
		b, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(cm, ".."+version), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cm, ".."+version, "keepwarm.toml"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(".."+version, filepath.Join(cm, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(cm, "..data_tmp"), filepath.Join(cm, "..data")); err != nil {
			t.Fatal(err)
		}
		if current != "" {
			if err := os.RemoveAll(filepath.Join(cm, ".."+current)); err != nil {
				t.Fatal(err)
			}
		}
		current = version
	}
	publish("2026_11_30_v1", `"1"`)
	if err := os.Symlink("..data/keepwarm.toml", filepath.Join(cm, "keepwarm.toml")); err != nil {
		t.Fatal(err)
	}
	logs, stop := startRun(t, filepath.Join(cm, "keepwarm.toml"))
	key := func(id string) string { return f.prefix + "item:" + id }
	testenv.EventuallyDiag(t, 10*time.Second, "pinned id 1 written", withLog(logs, func() bool { return rdb.Exists(ctx, key("1")).Val() == 1 }))

	publish("2026_11_30_v2", `"1", "7"`)
	testenv.EventuallyDiag(t, 15*time.Second, "id 7 written after the ConfigMap swap", withLog(logs, func() bool {
		return rdb.Exists(ctx, key("7")).Val() == 1
	}))
	if !strings.Contains(logs.String(), `msg="config reloaded" reason=file`) {
		t.Errorf("no file reload logged:\n%s", logs)
	}
	if code := stop(); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0\n%s", code, logs)
	}
}
