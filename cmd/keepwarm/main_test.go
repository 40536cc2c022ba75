package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/examples/chinook"
	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/internal/testenv"
)

const demoConfig = "../../config.toml"

// keepwarm runs the command line in-process and returns stdout, stderr and the exit code main would use.
func keepwarm(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := run(ctx, args, &stdout, &stderr)
	code := exitCode(err, &stderr)
	return stdout.String(), stderr.String(), code
}

// chinookDSN loads the demo catalog if needed and points the config at it through the environment.
func chinookDSN(t *testing.T) string {
	t.Helper()
	dsn, err := chinook.DSNFor(testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	testenv.Postgres(t) // fails with a how-to-start message when PostgreSQL is down
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := chinook.Load(ctx, dsn); err != nil {
		t.Fatalf("load chinook: %v", err)
	}
	return dsn
}

func TestValidateDemoConfig(t *testing.T) {
	t.Parallel()
	stdout, stderr, code := keepwarm(t, "validate", "--config", demoConfig)
	if code != 0 {
		t.Fatalf("validate: exit %d, stderr:\n%s", code, stderr)
	}
	for _, want := range []string{
		"ok: ../../config.toml: 4 keyspaces, 2 hotkeys lists, 1 schedule\n",
		"KEYSPACE     KEY                TTL  JITTER  REFRESH AHEAD  LOCK TTL  STALE TTL  TOP N  MAX TRACKED  DECAY  HISTORY  PINNED  SCHEDULES\n",
		"track        track:${id}        10s  0.1     20% (2s)       10s       10m0s      500    5000         10m0s  1h0m0s   9       -\n",
		"chart-genre  chart:genre:${id}  10s  0.1     25% (2.5s)     10s       -          25     10000        10m0s  1h0m0s   0       charts-before-work\n",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("validate: got\n%s\nwant it to contain\n%s", stdout, want)
		}
	}
}

// TestValidateSaysWhichRedisSourceWon: KEEPWARM_REDIS_URL replaces the file's addresses, and validate says so.
func TestValidateSaysWhichRedisSourceWon(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	text, err := os.ReadFile(demoConfig)
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(text), `url = "redis://127.0.0.1:16379/0"`, `addresses = ["10.0.0.1:6379"]`, 1)
	edited = strings.ReplaceAll(edited, `file = "examples/`, `file = "`+root+`/examples/`)
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KEEPWARM_REDIS_URL", "redis://127.0.0.1:16379/0")
	stdout, stderr, code := keepwarm(t, "validate", "--config", p)
	if code != 0 {
		t.Fatalf("validate: exit %d, stderr:\n%s", code, stderr)
	}
	if want := "note: redis: url from KEEPWARM_REDIS_URL replaces the file's addresses (10.0.0.1:6379)\n"; !strings.Contains(stdout, want) {
		t.Errorf("validate: got\n%s\nwant it to contain\n%s", stdout, want)
	}
}

func TestValidateCheckDB(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	t.Setenv("KEEPWARM_POSTGRES_DSN", chinookDSN(t))
	stdout, stderr, code := keepwarm(t, "validate", "--config", demoConfig, "--check-db")
	if code != 0 || !strings.Contains(stdout, "queries prepared on PostgreSQL") {
		t.Fatalf("validate --check-db: exit %d\n%s%s", code, stdout, stderr)
	}
	// A query that does not prepare is reported with its keyspace.
	text, err := os.ReadFile(demoConfig)
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(text), "join genre g on g.genre_id = ids.id::int", "join genres g on g.genre_id = ids.id::int", 1)
	p := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(p, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(filepath.Dir(p), "examples/hotkeys"), 0o755); err != nil {
		t.Fatal(err)
	}
	hk, _ := os.ReadFile("../../examples/hotkeys/black-friday.txt")
	if err := os.WriteFile(filepath.Join(filepath.Dir(p), "examples/hotkeys/black-friday.txt"), hk, 0o644); err != nil {
		t.Fatal(err)
	}
	_, stderr, code = keepwarm(t, "validate", "--config", p, "--check-db")
	if code != 1 || !strings.Contains(stderr, `keyspace "chart-genre": query: ERROR: relation "genres" does not exist (SQLSTATE 42P01)`) {
		t.Errorf("validate --check-db with a bad query: exit %d, stderr:\n%s", code, stderr)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "bad.toml")
	text := `
[redis]
url = "redis://127.0.0.1:16379/0"
[postgres]
dsn = "postgres://keepwarm@127.0.0.1:15432/keepwarm"
[[keyspace]]
name = "track"
key = "track:${id}"
ttl = "5x"
jiter = 0.2
query = "select $1"
`
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := keepwarm(t, "validate", "--config", p)
	if code != 1 || stdout != "" {
		t.Fatalf("validate: got exit %d and stdout %q, want exit 1 and no output", code, stdout)
	}
	for _, want := range []string{
		"bad.toml: 2 problems:\n",
		`  keyspace "track": ttl: "5x" is not a duration`,
		`  keyspace "track": unknown key "jiter" (did you mean "jitter"?)`,
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("validate: got stderr\n%s\nwant it to contain %q", stderr, want)
		}
	}
}

func TestValidateHidesSecrets(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	const redisPW, pgPW = "redis-pw-never-shown", "pg-pw-never-shown"
	t.Setenv("KEEPWARM_REDIS_PASSWORD", redisPW)
	t.Setenv("KEEPWARM_POSTGRES_DSN", "postgres://keepwarm:"+pgPW+"@127.0.0.1:15432/chinook?sslmode=disable")
	stdout, stderr, code := keepwarm(t, "validate", "--config", demoConfig)
	if code != 0 {
		t.Fatalf("validate: exit %d: %s", code, stderr)
	}
	// An invalid environment value, and a failing database check, must not show them either.
	t.Setenv("KEEPWARM_REDIS_DB", "x")
	_, stderr2, code2 := keepwarm(t, "validate", "--config", demoConfig)
	t.Setenv("KEEPWARM_REDIS_DB", "0")
	t.Setenv("KEEPWARM_POSTGRES_DSN", "postgres://keepwarm:"+pgPW+"@127.0.0.1:1/chinook?sslmode=disable&connect_timeout=1")
	_, stderr3, code3 := keepwarm(t, "validate", "--config", demoConfig, "--check-db")
	if code2 != 1 || code3 != 1 {
		t.Errorf("bad env and unreachable database: got exits %d and %d, want 1 and 1", code2, code3)
	}
	if !strings.Contains(stderr3, "postgres://keepwarm:xxxxx@127.0.0.1:1/chinook") {
		t.Errorf("unreachable database: want the redacted DSN in %q", stderr3)
	}
	for _, out := range []string{stdout, stderr, stderr2, stderr3} {
		if strings.Contains(out, redisPW) || strings.Contains(out, pgPW) {
			t.Errorf("output shows a secret:\n%s", out)
		}
	}
}

func TestFetch(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	t.Setenv("KEEPWARM_POSTGRES_DSN", chinookDSN(t))
	stdout, stderr, code := keepwarm(t, "fetch", "--config", demoConfig, "--keyspace", "track", "1", "2", "999999", "1")
	if code != 0 {
		t.Fatalf("fetch: exit %d, stderr:\n%s", code, stderr)
	}
	want := `track:1: 289 bytes, ttl 10s..11s (jitter 0.1)
{"id" : 1, "name" : "For Those About To Rock (We Salute You)", "album" : "For Those About To Rock We Salute You", "artist" : "AC/DC", "genre" : "Rock", "media_type" : "MPEG audio file", "composer" : "Angus Young, Malcolm Young, Brian Johnson", "milliseconds" : 343719, "unit_price" : 0.99}

track:2: 292 bytes, ttl 10s..11s (jitter 0.1)
{"id" : 2, "name" : "Balls to the Wall", "album" : "Balls to the Wall", "artist" : "Accept", "genre" : "Rock", "media_type" : "Protected AAC audio file", "composer" : "U. Dirkschneider, W. Hoffmann, H. Frank, P. Baltes, S. Kaufmann, G. Hoffmann", "milliseconds" : 342562, "unit_price" : 0.99}

track:999999: missing: missing = "delete": would delete the key
`
	if stdout != want {
		t.Errorf("fetch: got\n%s\nwant\n%s", stdout, want)
	}
	stdout, _, code = keepwarm(t, "fetch", "--config", demoConfig, "--keyspace", "artist", "0")
	if code != 0 || stdout != "artist:0: missing: missing = \"tombstone\": would write null (4 bytes), ttl 10s\n" {
		t.Errorf("fetch artist 0: exit %d, got %q", code, stdout)
	}
}

func TestMigrate(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	t.Setenv("KEEPWARM_POSTGRES_DSN", testenv.Database(t))
	// An empty database has no demo tables to publish (TestMigrateChanges covers that part).
	t.Setenv("KEEPWARM_CHANGES_ENABLED", "false")

	steps := []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "status", "--config", demoConfig}, "1        pending  -           00001_warmup_runs.sql"},
		{[]string{"migrate", "up", "--config", demoConfig}, "now at version 2"},
		{[]string{"migrate", "--config", demoConfig, "up"}, "up to date at version 2"},
		{[]string{"migrate", "down", "--config", demoConfig}, "now at version 1"},
		{[]string{"migrate", "down", "--config", demoConfig}, "now at version 0"},
		{[]string{"migrate", "up", "--config", demoConfig}, "OK    up 00001_warmup_runs.sql"},
		{[]string{"migrate", "status", "--config", demoConfig}, "2        applied"},
	}
	for _, s := range steps {
		stdout, stderr, code := keepwarm(t, s.args...)
		if code != 0 || !strings.Contains(stdout, s.want) {
			t.Fatalf("%s: exit %d, got\n%s%s\nwant it to contain %q", strings.Join(s.args, " "), code, stdout, stderr, s.want)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"no command", nil, "usage: keepwarm <command>"},
		{"unknown command", []string{"frobnicate"}, `keepwarm: unknown command "frobnicate"`},
		{"unknown flag", []string{"validate", "--confg", "x"}, "flag provided but not defined: -confg"},
		{"extra argument", []string{"validate", "--config", demoConfig, "extra"}, `unexpected argument "extra"`},
		{"fetch without keyspace", []string{"fetch", "--config", demoConfig, "1"}, "--keyspace is required"},
		{"fetch without ids", []string{"fetch", "--config", demoConfig, "--keyspace", "track"}, "give at least one id"},
		{"fetch unknown keyspace", []string{"fetch", "--config", demoConfig, "--keyspace", "tracks", "1"}, `no keyspace "tracks"`},
		{"fetch invalid id", []string{"fetch", "--config", demoConfig, "--keyspace", "track", ""}, "lockstep: invalid id: empty"},
		{"migrate without action", []string{"migrate", "--config", demoConfig}, "say up, down or status"},
		{"migrate unknown action", []string{"migrate", "sideways", "--config", demoConfig}, `unknown action "sideways"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, stderr, code := keepwarm(t, tt.args...)
			if code != 2 || !strings.Contains(stderr, tt.want) {
				t.Errorf("keepwarm %q: got exit %d and stderr\n%s\nwant exit 2 and %q", tt.args, code, stderr, tt.want)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	all := [][]string{{"help"}, {"-h"}, {"--help"}, {"migrate", "up", "--help"}}
	for _, c := range commands() { // every command and subcommand prints its usage and exits 0
		all = append(all, []string{c.name, "-h"}, []string{c.name, "--help"})
	}
	for _, args := range all {
		_, _, code := keepwarm(t, args...)
		if code != 0 {
			t.Errorf("keepwarm %q: exit %d, want 0", args, code)
		}
	}
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	var sink bytes.Buffer
	for _, tt := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{errHelp, 0},
		{usagef("bad"), 2},
		{&config.ValidationError{Path: "c", Problems: []string{"p"}}, 1},
		{errors.New("boom"), 1},
	} {
		if got := exitCode(tt.err, &sink); got != tt.want {
			t.Errorf("exitCode(%v): got %d, want %d", tt.err, got, tt.want)
		}
	}
}

// TestValidateCheckNamesADatabaseOutOfRange: validate --check against a Redis with fewer databases than the
// config's db names the db (it printed `redis : ERR DB index is out of range`).
func TestValidateCheckNamesADatabaseOutOfRange(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	testenv.Redis(t) // fails with a how-to-start message when Redis is down
	t.Setenv("KEEPWARM_POSTGRES_DSN", chinookDSN(t))
	u := testenv.RedisURL()
	t.Setenv("KEEPWARM_REDIS_URL", u[:strings.LastIndex(u, "/")]+"/9999")
	_, stderr, code := keepwarm(t, "validate", "--config", demoConfig, "--check")
	if want := "db 9999: the server has fewer databases"; code != 1 || !strings.Contains(stderr, want) {
		t.Errorf("validate --check with db 9999: exit %d, want 1 and %q in\n%s", code, want, stderr)
	}
}
