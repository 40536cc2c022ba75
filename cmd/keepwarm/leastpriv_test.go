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
	"github.com/keepwarm/keepwarm/lockstep"
)

// redisACLRule is the Redis ACL that docs/operations.md ("Least privilege") gives for `keepwarm run`, with the key
// patterns of the test's keyspace (prefix stands for the keyspace's key templates).
func redisACLRule(prefix string) []any {
	rule := []any{"on", ">s3cret-acl", "resetkeys", "resetchannels", "nocommands"}
	for _, p := range []string{prefix + "*", "lock:" + prefix + "*", "stale:" + prefix + "*", "meta:" + prefix + "*", "keepwarm:*"} {
		rule = append(rule, "~"+p)
	}
	rule = append(rule, "&__keyevent@*__:*")
	for _, c := range strings.Fields(redisACLCommands) {
		rule = append(rule, "+"+c)
	}
	return rule
}

// redisACLCommands are the commands `keepwarm run` sends (INFO commandstats of a run with notifications, stale
// copies, metadata, pinned and tracked keys), as docs/operations.md lists them.
const redisACLCommands = `ping hello client|setname config|get subscribe unsubscribe
	get set del exists type pttl pexpire pexpireat pexpiretime time hset hdel hget
	evalsha eval script|load
	zincrby zunionstore zremrangebyscore zremrangebyrank zrevrangebyscore zrevrange zrange zscore zcard zrem zadd
	smembers sadd multi exec`

func readyzBody(t *testing.T, addr string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// leastPrivConfig writes a config with one keyspace (stale copies, metadata, tracking) over f's table.
func leastPrivConfig(t *testing.T, f *daemonFixture) string {
	t.Helper()
	p := filepath.Join(f.dir, "leastpriv.toml")
	cfg := fmt.Sprintf(`
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
stale = "stale:${key}"
stale_ttl = "1m"
meta = "meta:${key}"
keep_meta = true
ttl = "2s"
refresh_ahead = "600ms"
lock_ttl = "3s"
top_n = 10
min_score = 0.5
query = 'select id, body from %s where id = any($1)'
[[hotkeys]]
name = "pins"
keyspace = "items"
ids = ["1"]
`, testenv.PostgresURL(), f.prefix, f.table)
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// readOnlyRole makes a PostgreSQL role with the grants docs/operations.md gives for `keepwarm run` without
// schedules (CONNECT, USAGE on the source's schema, SELECT on its table), read-only by default, and returns its
// DSN. The role is dropped on cleanup.
func readOnlyRole(t *testing.T, f *daemonFixture) string {
	t.Helper()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	role := "kwro_" + strings.ToLower(strings.NewReplacer(":", "", "_", "").Replace(f.prefix[len(f.prefix)-9:]))
	schema, _, _ := strings.Cut(f.table, ".")
	db := pool.Config().ConnConfig.Database
	for _, q := range []string{
		"create role " + role + " login",
		"alter role " + role + " set default_transaction_read_only = on",
		"grant connect on database " + pgx.Identifier{db}.Sanitize() + " to " + role,
		"grant usage on schema " + schema + " to " + role,
		"grant select on " + f.table + " to " + role,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		for _, q := range []string{"drop owned by " + role, "drop role " + role} {
			if _, err := pool.Exec(context.Background(), q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	cfg := pool.Config().ConnConfig
	return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", role, cfg.Host, cfg.Port, db)
}

// TestRunUnderLeastPrivilegeRedisACL runs the daemon as a Redis ACL user with only the documented commands, keys
// and channels, and as a read-only PostgreSQL role with only SELECT on the source table: it gets ready, writes a pinned and a hot key, and Redis logs no denial (ACL LOG); it stops with
// exit 0 and no lock left.
func TestRunUnderLeastPrivilegeRedisACL(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	priv := testenv.PrivateRedis(t)
	ctx := context.Background()
	if err := priv.ConfigSet(ctx, "notify-keyspace-events", "EA").Err(); err != nil {
		t.Fatal(err)
	}
	f := newDaemonFixture(t)
	if err := priv.Do(ctx, append([]any{"ACL", "SETUSER", "keepwarm"}, redisACLRule(f.prefix)...)...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Setenv("KEEPWARM_REDIS_URL", "redis://keepwarm:s3cret-acl@"+priv.Options().Addr+"/0")
	dsn := readOnlyRole(t, f)
	t.Setenv("KEEPWARM_POSTGRES_DSN", dsn)
	logs, stop := startRun(t, leastPrivConfig(t, f))
	addr := listenAddr(t, logs)
	if !strings.Contains(logs.String(), `postgres.dsn="`+dsn+`"`) {
		t.Fatalf("the daemon does not run as the read-only role %s:\n%s", dsn, logs)
	}
	testenv.EventuallyDiag(t, 10*time.Second, "/readyz 200", withLog(logs, func() bool { code, _ := readyzBody(t, addr); return code == 200 }))
	// An app reads id 2 often (lockstep's access recording): the daemon's tracker makes it hot and warms it.
	if err := priv.ZIncrBy(ctx, "keepwarm:access:items", 10, "2").Err(); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyDiag(t, 15*time.Second, "pinned id 1 and hot id 2 written", withLog(logs, func() bool {
		return priv.Exists(ctx, f.prefix+"item:1", f.prefix+"item:2").Val() == 2
	}))
	// A refresh of id 1 under the ACL (ttl 2 s, refresh 600 ms ahead): its write time in the metadata moves.
	first := priv.HGet(ctx, "meta:"+f.prefix+"item:1", lockstep.MetaWrittenField).Val()
	testenv.EventuallyDiag(t, 15*time.Second, "a refresh of id 1", withLog(logs, func() bool {
		v, err := priv.HGet(ctx, "meta:"+f.prefix+"item:1", lockstep.MetaWrittenField).Result()
		return err == nil && v != first
	}))
	if code := stop(); code != 0 {
		t.Errorf("exit code = %d\n%s", code, logs)
	}
	denials, err := priv.Do(ctx, "ACL", "LOG").Slice()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range denials {
		t.Errorf("ACL denial: %v", d)
	}
	if locks := priv.Keys(ctx, "lock:*").Val(); len(locks) != 0 {
		t.Errorf("locks left: %v", locks)
	}
	if strings.Contains(logs.String(), "s3cret-acl") {
		t.Errorf("the Redis password appears in the log")
	}
}

// TestRunNamesRedisNOPERM: an ACL user without client|setname cannot connect (go-redis names its connections).
// The daemon must say it is a permission problem, in the log and in /readyz, not just "cannot reach a dependency".
func TestRunNamesRedisNOPERM(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	priv := testenv.PrivateRedis(t)
	ctx := context.Background()
	f := newDaemonFixture(t)
	rule := redisACLRule(f.prefix)
	rule = append(rule, "-client|setname")
	if err := priv.Do(ctx, append([]any{"ACL", "SETUSER", "keepwarm"}, rule...)...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Setenv("KEEPWARM_REDIS_URL", "redis://keepwarm:s3cret-acl@"+priv.Options().Addr+"/0")
	logs, stop := startRun(t, leastPrivConfig(t, f))
	testenv.EventuallyDiag(t, 10*time.Second, "permission logged", withLog(logs, func() bool {
		return strings.Contains(logs.String(), "permission denied by a dependency") && strings.Contains(logs.String(), "redis NOPERM")
	}))
	i := strings.Index(logs.String(), "listen=")
	addr := strings.Fields(logs.String()[i+len("listen="):])[0]
	code, body := readyzBody(t, addr)
	if code != 503 || !strings.Contains(body, "redis NOPERM") || !strings.Contains(body, "client|setname") {
		t.Errorf("/readyz = %d %q, want 503 naming redis NOPERM and the command", code, body)
	}
	if code := stop(); code != 0 {
		t.Errorf("exit code = %d\n%s", code, logs)
	}
}

// TestReadyzNamesRefreshNOPERM: an ACL user that may not touch the lock keys connects and pings fine, but every
// refresh fails (SET NX answers NOPERM). /readyz must turn 503 and name the keyspace and the permission, instead
// of staying ready while no value is ever written.
func TestReadyzNamesRefreshNOPERM(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	priv := testenv.PrivateRedis(t)
	ctx := context.Background()
	f := newDaemonFixture(t)
	var rule []any
	for _, r := range redisACLRule(f.prefix) {
		if r != "~lock:"+f.prefix+"*" {
			rule = append(rule, r)
		}
	}
	if err := priv.Do(ctx, append([]any{"ACL", "SETUSER", "keepwarm"}, rule...)...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Setenv("KEEPWARM_REDIS_URL", "redis://keepwarm:s3cret-acl@"+priv.Options().Addr+"/0")
	logs, stop := startRun(t, leastPrivConfig(t, f))
	addr := listenAddr(t, logs)
	var body string
	testenv.EventuallyDiag(t, 30*time.Second, "/readyz 503 naming the keyspace and NOPERM", withLog(logs, func() bool {
		var code int
		code, body = readyzBody(t, addr)
		return code == 503 && strings.Contains(body, `keyspace "items": every refresh fails`) && strings.Contains(body, "redis NOPERM")
	}))
	t.Logf("/readyz: %s", body)
	if code := stop(); code != 0 {
		t.Errorf("exit code = %d\n%s", code, logs)
	}
	if strings.Contains(body, "s3cret-acl") || strings.Contains(logs.String(), "s3cret-acl") {
		t.Errorf("the Redis password appears in /readyz or the log")
	}
}

// TestValidateCheckTestsRedisToo: validate --check connects to Redis with the configured credentials, so a wrong
// password fails it (naming authentication), while --check-db alone looks at PostgreSQL only.
func TestValidateCheckTestsRedisToo(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	priv := testenv.PrivateRedis(t)
	ctx := context.Background()
	f := newDaemonFixture(t)
	if err := priv.Do(ctx, append([]any{"ACL", "SETUSER", "keepwarm"}, redisACLRule(f.prefix)...)...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	path := leastPrivConfig(t, f)
	for _, tc := range []struct {
		name, password, flag string
		wantCode             int
		wantOut              string
	}{
		{"right password", "s3cret-acl", "--check", 0, "redis: answered PING with the configured credentials"},
		{"wrong password", "wrong-pass", "--check", 1, "redis authentication failed"},
		{"wrong password, --check-db only", "wrong-pass", "--check-db", 0, "queries prepared on PostgreSQL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KEEPWARM_REDIS_URL", "redis://keepwarm:"+tc.password+"@"+priv.Options().Addr+"/0")
			stdout, stderr, code := keepwarm(t, "validate", "--config", path, tc.flag)
			if code != tc.wantCode || !strings.Contains(stdout+stderr, tc.wantOut) {
				t.Errorf("validate %s: exit %d, want %d with %q\n%s%s", tc.flag, code, tc.wantCode, tc.wantOut, stdout, stderr)
			}
			if strings.Contains(stdout+stderr, tc.password) {
				t.Errorf("the password appears in the output:\n%s%s", stdout, stderr)
			}
		})
	}
}
