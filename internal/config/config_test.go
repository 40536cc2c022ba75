package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/warmer"
)

// write writes a config (and any extra files) into a fresh directory and returns the config's path.
func write(t *testing.T, text string, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(dir, "keepwarm.toml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// base is a minimal valid config; the placeholders let a test add keys to a section.
const base = `
[redis]
url = "redis://127.0.0.1:16379/0"
#REDIS

[postgres]
dsn = "postgres://keepwarm@127.0.0.1:15432/keepwarm?sslmode=disable"
#POSTGRES

[daemon]
#DAEMON

[[keyspace]]
name = "track"
key = "track:${id}"
ttl = "30s"
query = "select id, id from unnest($1::text[]) as id"
#KEYSPACE

#REST
`

func cfg(parts map[string]string) string {
	s := base
	for k, v := range parts {
		s = strings.Replace(s, "#"+k+"\n", v+"\n", 1)
	}
	return s
}

func load(t *testing.T, text string, files map[string]string, env ...string) (*config.Config, error) {
	t.Helper()
	return config.LoadEnv(write(t, text, files), env)
}

func mustLoad(t *testing.T, text string, files map[string]string, env ...string) *config.Config {
	t.Helper()
	c, err := load(t, text, files, env...)
	if err != nil {
		t.Fatalf("LoadEnv: %v", err)
	}
	return c
}

func TestDemoConfig(t *testing.T) {
	c, err := config.LoadEnv("../../config.toml", nil)
	if err != nil {
		t.Fatalf("LoadEnv(config.toml): %v", err)
	}
	var names []string
	for _, ks := range c.Keyspaces {
		names = append(names, ks.Name)
		if ks.Keys() == nil {
			t.Errorf("keyspace %q: Keys() is nil", ks.Name)
		}
	}
	if want := []string{"track", "album", "artist", "chart-genre"}; !slices.Equal(names, want) {
		t.Errorf("keyspaces: got %q, want %q", names, want)
	}
	track := c.Keyspace("track")
	if got, want := c.Pinned("track"), []string{"1", "2", "3", "6", "7", "8", "9", "20", "3503"}; !slices.Equal(got, want) {
		t.Errorf("Pinned(track): got %q, want %q", got, want)
	}
	if got := c.Pinned("album"); got != nil {
		t.Errorf("Pinned(album): got %q, want nil", got)
	}
	if got := track.RefreshAhead; got != 2*time.Second || track.RefreshAheadFraction != 0.2 { // 20% of 10s
		t.Errorf("track refresh-ahead: got %s, want 2s", got)
	}
	if got := c.Keyspace("album").RefreshAhead; got != 2*time.Second { // a duration
		t.Errorf("album refresh-ahead: got %s, want 2s", got)
	}
	ks, err := track.Keys().For("42")
	if err != nil || ks.Cache != "track:42" || ks.Lock != "lock:track:42" || ks.Stale != "stale:track:42" {
		t.Errorf("track keys for 42: got %+v, %v", ks, err)
	}
	s := c.Schedules[0]
	if s.Spec() == nil || s.CronSpec() != "CRON_TZ=Europe/Paris 0 30 7 * * mon-fri" {
		t.Errorf("schedule: got spec %v and %q", s.Spec(), s.CronSpec())
	}
	// Monday 2025-03-03 07:00 in Paris: next run at 07:30 Paris time.
	paris, _ := time.LoadLocation("Europe/Paris")
	if got, want := s.Spec().Next(time.Date(2025, 3, 3, 7, 0, 0, 0, paris)), time.Date(2025, 3, 3, 7, 30, 0, 0, paris); !got.Equal(want) {
		t.Errorf("schedule next: got %s, want %s", got, want)
	}
	bf := c.HotkeysList("black-friday")
	if bf == nil || !filepath.IsAbs(bf.File) || !strings.HasSuffix(bf.File, "examples/hotkeys/black-friday.txt") {
		t.Errorf("black-friday file: got %+v, want an absolute path", bf)
	}
}

func TestDefaults(t *testing.T) {
	c := mustLoad(t, cfg(nil), nil)
	ks := c.Keyspaces[0]
	checks := []struct {
		name      string
		got, want any
	}{
		{"redis.mode", c.Redis.Mode, config.ModeSingle},
		{"redis.dial_timeout", c.Redis.DialTimeout, config.DefaultRedisDialTimeout},
		{"redis.notifications", c.Redis.Notifications, config.NotificationsOn},
		{"postgres.max_conns", c.Postgres.MaxConns, int32(config.DefaultPostgresMaxConns)},
		{"postgres.statement_timeout", c.Postgres.StatementTimeout, config.DefaultPostgresStatementTimeout},
		{"postgres.pool_wait_timeout", c.Postgres.PoolWaitTimeout, time.Second},
		{"daemon.listen", c.Daemon.Listen, "127.0.0.1:9471"},
		{"daemon.log_format", c.Daemon.LogFormat, "json"},
		{"lock", ks.Lock, "lock:${key}"},
		{"meta", ks.Meta, "meta:${key}"},
		{"stale", ks.Stale, ""},
		{"jitter", ks.Jitter, 0.1},
		{"refresh_ahead", ks.RefreshAhead, 6 * time.Second},
		{"lock_ttl", ks.LockTTL, 10 * time.Second},
		{"missing", ks.Missing, warmer.MissingDelete},
		{"batch_size", ks.BatchSize, warmer.DefaultBatchSize},
		{"top_n", ks.TopN, warmer.DefaultTopN},
		{"max_tracked", ks.MaxTracked, warmer.DefaultMaxTrackedFactor * warmer.DefaultTopN},
		{"decay_half_life", ks.DecayHalfLife, 10 * time.Minute},
		{"max_stale", ks.MaxStale, 5 * time.Minute},
		{"max_value_bytes", ks.MaxValueBytes, 1 << 20},
		{"lfu", ks.LFU, false},
	}
	for _, tt := range checks {
		if tt.got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, tt.got, tt.want)
		}
	}
	// Derived defaults follow the values they derive from.
	c = mustLoad(t, cfg(map[string]string{
		"POSTGRES": `statement_timeout = "8s"`,
		"KEYSPACE": "stale = \"old:${key}\"\nmissing = \"tombstone\"\ntombstone_value = \"\"\ntop_n = 0",
	}), nil)
	ks = c.Keyspaces[0]
	if ks.LockTTL != 16*time.Second || ks.StaleTTL != 300*time.Second || ks.TombstoneTTL != ks.TTL || ks.MaxTracked != warmer.DefaultMaxTracked {
		t.Errorf("derived defaults: got lock_ttl %s, stale_ttl %s, tombstone_ttl %s, max_tracked %d; want 16s, 5m, 30s, %d",
			ks.LockTTL, ks.StaleTTL, ks.TombstoneTTL, ks.MaxTracked, warmer.DefaultMaxTracked)
	}
}

func TestListen(t *testing.T) {
	for _, listen := range []string{"127.0.0.1:9471", ":9471", "127.0.0.1:0", "[::1]:9471"} {
		c := mustLoad(t, cfg(map[string]string{"DAEMON": `listen = "` + listen + `"`}), nil)
		if c.Daemon.Listen != listen {
			t.Errorf("listen: got %q, want %q", c.Daemon.Listen, listen)
		}
	}
}

func TestRefreshAheadForms(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration // for a 30s TTL
	}{
		{`0.2`, 6 * time.Second},
		{`"0.5"`, 15 * time.Second},
		{`"10%"`, 3 * time.Second},
		{`"2s"`, 2 * time.Second},
		{`"1m"`, -1}, // longer than the TTL
		{`1`, -1},
		{`"soon"`, -1},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			c, err := load(t, cfg(map[string]string{"KEYSPACE": "refresh_ahead = " + tt.in}), nil)
			if tt.want < 0 {
				if err == nil || !strings.Contains(err.Error(), `keyspace "track": refresh_ahead: `) {
					t.Errorf("got %v, want a refresh_ahead error", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Keyspaces[0].RefreshAhead; got != tt.want {
				t.Errorf("refresh_ahead with a 30s ttl: got %s, want %s", got, tt.want)
			}
		})
	}
}

func TestBadConfigs(t *testing.T) {
	tests := []struct {
		name  string
		text  string
		files map[string]string
		want  string
	}{
		{"ttl not a duration", strings.Replace(cfg(nil), `ttl = "30s"`, `ttl = "5x"`, 1), nil,
			`keyspace "track": ttl: "5x" is not a duration`},
		{"ttl without a unit", strings.Replace(cfg(nil), `ttl = "30s"`, `ttl = 30`, 1), nil,
			`keyspace "track": ttl: 30 is not a duration: write it as a string with a unit`},
		{"ttl missing", strings.Replace(cfg(nil), `ttl = "30s"`, ``, 1), nil,
			`keyspace "track": ttl: missing (required)`},
		{"negative duration", cfg(map[string]string{"KEYSPACE": `max_stale = "-1s"`}), nil,
			`keyspace "track": max_stale: must be more than 0, got "-1s"`},
		{"typo in a keyspace key", cfg(map[string]string{"KEYSPACE": `jiter = 0.2`}), nil,
			`keyspace "track": unknown key "jiter" (did you mean "jitter"?)`},
		{"typo in a section name", cfg(map[string]string{"REST": "[deamon]\nlisten = \":1\""}), nil,
			`unknown section "deamon" (did you mean "daemon"?)`},
		{"typo in redis.tls", cfg(map[string]string{"REST": "[redis.tls]\nca_fle = \"x\""}), nil,
			`redis.tls: unknown key "ca_fle" (did you mean "ca_file"?)`},
		{"key template without ${id}", strings.Replace(cfg(nil), `key = "track:${id}"`, `key = "track"`, 1), nil,
			`keyspace "track": key: lockstep: invalid template: "track": has no ${id} or ${key} placeholder`},
		{"unknown placeholder", cfg(map[string]string{"KEYSPACE": `lock = "lock:${kye}"`}), nil,
			`keyspace "track": lock: lockstep: invalid template: "lock:${kye}": unknown placeholder ${kye}`},
		{"cluster without hash tag", cfg(map[string]string{"REDIS": `mode = "cluster"`}), nil,
			`keyspace "track": [redis] mode = "cluster": key template "track:${id}": no fixed Redis Cluster hash tag`},
		{"lock_ttl not above statement timeout", cfg(map[string]string{"KEYSPACE": `lock_ttl = "2s"`}), nil,
			`keyspace "track": lock_ttl: 2s must be longer than postgres.statement_timeout (5s)`},
		{"jitter out of range", cfg(map[string]string{"KEYSPACE": `jitter = 1.5`}), nil,
			`keyspace "track": jitter: 1.5 is outside [0,1]`},
		{"duplicate keyspace name", cfg(map[string]string{"REST": "[[keyspace]]\nname = \"track\"\nkey = \"t2:${id}\"\nttl = \"1s\"\nquery = \"$1\""}), nil,
			`keyspace "track": name: "track" is used by another [[keyspace]]`},
		{"duplicate key template", cfg(map[string]string{"REST": "[[keyspace]]\nname = \"t2\"\nkey = \"track:${id}\"\nttl = \"1s\"\nquery = \"$1\""}), nil,
			`keyspace "t2": key: "track:${id}" is also the key template of keyspace "track"`},
		{"query without $1", strings.Replace(cfg(nil), `unnest($1::text[])`, `unnest(array['1'])`, 1), nil,
			`keyspace "track": query: does not use $1`},
		{"tombstone without value", cfg(map[string]string{"KEYSPACE": `missing = "tombstone"`}), nil,
			`keyspace "track": tombstone_value: required with missing = "tombstone"`},
		{"unknown missing policy", cfg(map[string]string{"KEYSPACE": `missing = "ignore"`}), nil,
			`keyspace "track": missing: "ignore" is not a policy`},
		{"stale_ttl without stale", cfg(map[string]string{"KEYSPACE": `stale_ttl = "1h"`}), nil,
			`keyspace "track": stale_ttl: is set but stale`},
		{"wrong type", cfg(map[string]string{"KEYSPACE": `batch_size = "ten"`}), nil,
			`keyspace "track": batch_size: "ten" is not an integer`},
		{"keyspace as a table", strings.Replace(cfg(nil), "[[keyspace]]", "[keyspace]", 1), nil,
			`keyspace: want an array of tables ([[keyspace]]), got a table`},
		{"hotkeys of an unknown keyspace", cfg(map[string]string{"REST": "[[hotkeys]]\nname = \"hk\"\nkeyspace = \"tracks\"\nids = [\"1\"]"}), nil,
			`hotkeys "hk": keyspace: "tracks" is not a [[keyspace]] name (known: track)`},
		{"hotkeys file missing", cfg(map[string]string{"REST": "[[hotkeys]]\nname = \"hk\"\nkeyspace = \"track\"\nfile = \"nope.txt\""}), nil,
			`hotkeys "hk": file: nope.txt: no such file or directory`},
		{"hotkeys inline bad id", cfg(map[string]string{"REST": "[[hotkeys]]\nname = \"hk\"\nkeyspace = \"track\"\nids = [\"1\", \"\"]"}), nil,
			`hotkeys "hk": ids[1]: lockstep: invalid id: empty`},
		{"schedule list unknown", cfg(map[string]string{"REST": "[[schedule]]\nname = \"s\"\ncron = \"@hourly\"\nkeyspace = \"track\"\nlist = \"bf\""}), nil,
			`schedule "s": list: "bf" is not a [[hotkeys]] name (there are none)`},
		{"schedule bad cron", cfg(map[string]string{"REST": "[[schedule]]\nname = \"s\"\ncron = \"61 * * * *\"\nkeyspace = \"track\"\nids = [\"1\"]"}), nil,
			`schedule "s": cron: "61 * * * *": end of range (61) above maximum (59)`},
		{"schedule bad time zone", cfg(map[string]string{"REST": "[[schedule]]\nname = \"s\"\ncron = \"@daily\"\ntimezone = \"Mars/Olympus\"\nkeyspace = \"track\"\nids = [\"1\"]"}), nil,
			`schedule "s": timezone: "Mars/Olympus" is not an IANA time zone`},
		{"schedule two id sources", cfg(map[string]string{"REST": "[[schedule]]\nname = \"s\"\ncron = \"@daily\"\nkeyspace = \"track\"\nids = [\"1\"]\nids_query = true"}), nil,
			`schedule "s": set exactly one of ids`},
		{"schedule ids_query without one", cfg(map[string]string{"REST": "[[schedule]]\nname = \"s\"\ncron = \"@daily\"\nkeyspace = \"track\"\nids_query = true"}), nil,
			`schedule "s": ids_query: keyspace "track" has no ids_query`},
		{"redis mode", cfg(map[string]string{"REDIS": `mode = "clustr"`}), nil,
			`redis: mode: "clustr" is not a mode`},
		{"redis notifications", cfg(map[string]string{"REDIS": `notifications = "yes"`}), nil,
			`redis: notifications: "yes" is not a setting: want "on", "auto" or "off"`},
		{"redis url and addresses", cfg(map[string]string{"REDIS": `addresses = ["127.0.0.1:6379"]`}), nil,
			`redis: set addresses or url, not both`},
		{"redis sentinel without master", strings.Replace(cfg(map[string]string{"REDIS": "mode = \"sentinel\"\naddresses = [\"h:26379\"]"}), `url = "redis://127.0.0.1:16379/0"`, "", 1), nil,
			`redis: master_name: required in sentinel mode`},
		{"redis bad address", strings.Replace(cfg(map[string]string{"REDIS": `addresses = ["localhost"]`}), `url = "redis://127.0.0.1:16379/0"`, "", 1), nil,
			`redis: addresses[0]: "localhost" is not host:port`},
		{"redis tls file without tls", cfg(map[string]string{"REST": "[redis.tls]\nca_file = \"ca.pem\""}), nil,
			`redis.tls: enabled: is false but ca_file is set`},
		{"redis tls ca file missing", cfg(map[string]string{"REST": "[redis.tls]\nenabled = true\nca_file = \"ca.pem\""}), nil,
			`redis.tls: ca_file: open `},
		{"postgres dsn missing", strings.Replace(cfg(nil), `dsn = "postgres://keepwarm@127.0.0.1:15432/keepwarm?sslmode=disable"`, "", 1), nil,
			`postgres: dsn: missing: set it here or in KEEPWARM_POSTGRES_DSN`},
		{"postgres dsn unparsable", cfg(map[string]string{"POSTGRES": `max_conns = 0`}), nil,
			`postgres: max_conns: must be at least 1, got 0`},
		{"postgres pool wait too long", cfg(map[string]string{"POSTGRES": `pool_wait_timeout = "2m"`}), nil,
			`postgres: pool_wait_timeout: 2m0s is more than 1m0s`},
		{"postgres pool wait zero", cfg(map[string]string{"POSTGRES": `pool_wait_timeout = "0s"`}), nil,
			`postgres: pool_wait_timeout: must be more than 0`},
		{"daemon log format", cfg(map[string]string{"DAEMON": `log_format = "xml"`}), nil,
			`daemon: log_format: "xml" is not a format: want json or text`},
		{"daemon listen", cfg(map[string]string{"DAEMON": `listen = "localhost"`}), nil,
			`daemon: listen: "localhost" is not host:port`},
		{"daemon listen port", cfg(map[string]string{"DAEMON": `listen = "localhost:http"`}), nil,
			`daemon: listen: "localhost:http": port "http" is not a number in [0, 65535]`},
		{"daemon log level", cfg(map[string]string{"DAEMON": `log_level = "verbose"`}), nil,
			`daemon: log_level: "verbose" is not a level`},
		// Every duration has an upper bound, named by its field; warmer's own checks (here top_n's
		// bound) are Load's too, with the same message as at start-up.
		{"ttl above a year", strings.Replace(cfg(map[string]string{"KEYSPACE": `stale = "old:${key}"`}), `ttl = "30s"`, `ttl = "876000h"`, 1), nil,
			`keyspace "track": ttl: "876000h" is above the limit of 8784h0m0s (one year)`},
		{"statement_timeout above a year", cfg(map[string]string{"POSTGRES": `statement_timeout = "1500000h"`}), nil,
			`postgres: statement_timeout: "1500000h" is above the limit`},
		{"spread above a year", cfg(map[string]string{"REST": "[[schedule]]\nname = \"s\"\ncron = \"@daily\"\nkeyspace = \"track\"\nids = [\"1\"]\nspread = \"9000h\""}), nil,
			`schedule "s": spread: "9000h" is above the limit`},
		{"lock_ttl not above the statement timeout", cfg(map[string]string{"POSTGRES": `statement_timeout = "20s"`, "KEYSPACE": `lock_ttl = "20s"`}), nil,
			`keyspace "track": lock_ttl: 20s must be longer than postgres.statement_timeout (20s)`},
		{"top_n above its bound", cfg(map[string]string{"KEYSPACE": `top_n = 2000000`}), nil,
			`keyspace "track": top_n: 2000000 is not in [0, 1000000]`},
		{"no keyspace", "[redis]\nurl = \"redis://h:1\"\n[postgres]\ndsn = \"postgres://h/db\"\n", nil,
			`no [[keyspace]]: define at least one`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := load(t, tt.text, tt.files)
			var ve *config.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("LoadEnv: got %v, want a *ValidationError", err)
			}
			found := false
			for _, p := range ve.Problems {
				found = found || strings.Contains(p, tt.want)
			}
			if !found {
				t.Errorf("LoadEnv: got problems\n\t%s\nwant one containing\n\t%s", strings.Join(ve.Problems, "\n\t"), tt.want)
			}
		})
	}
}

func TestAllProblemsTogether(t *testing.T) {
	_, err := load(t, strings.Replace(cfg(map[string]string{
		"KEYSPACE": "jitter = -1",
		"DAEMON":   `log_level = "loud"`,
		"REST":     "[[schedule]]\nname = \"s\"\ncron = \"@daily\"\nkeyspace = \"nope\"\nids = [\"1\"]",
	}), `ttl = "30s"`, `ttl = "5x"`, 1), nil)
	var ve *config.ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != 4 {
		t.Fatalf("LoadEnv: got %v, want a *ValidationError with 4 problems", err)
	}
	if !strings.Contains(err.Error(), "4 problems:\n  ") {
		t.Errorf("Error(): got %q, want one problem per line", err)
	}
}

func TestTOMLSyntaxError(t *testing.T) {
	_, err := load(t, "[redis]\nurl = \"redis://x:1\"\nmode = = \"single\"\n", nil)
	var ve *config.ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != 1 || !strings.HasPrefix(ve.Problems[0], "line 3, column 8: ") {
		t.Fatalf("LoadEnv: got %v, want a problem at line 3, column 8", err)
	}
	_, err = load(t, cfg(map[string]string{"KEYSPACE": `ttl = "1s"`}), nil) // a key given twice
	if err == nil || !strings.HasSuffix(err.Error(), ": line 18: key ttl is already defined") {
		t.Errorf("duplicate key: got %v, want a syntax error at line 18", err)
	}
}

func TestUnreadableFile(t *testing.T) {
	_, err := config.LoadEnv(filepath.Join(t.TempDir(), "none.toml"), nil)
	var ve *config.ValidationError
	if err == nil || errors.As(err, &ve) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadEnv(missing file): got %v, want a plain error wrapping os.ErrNotExist", err)
	}
}

func TestEnvOverride(t *testing.T) {
	text := cfg(map[string]string{"REDIS": `password = "from-file"`})
	c := mustLoad(t, text, nil,
		"KEEPWARM_POSTGRES_DSN=postgres://kw:pw@db.internal:5432/app?sslmode=verify-full",
		"KEEPWARM_REDIS_PASSWORD=from-env",
		"KEEPWARM_REDIS_DB=3",
		"KEEPWARM_REDIS_TLS_ENABLED=true",
		"KEEPWARM_DAEMON_LOG_LEVEL=debug",
		"KEEPWARM_POSTGRES_STATEMENT_TIMEOUT=2s",
		"KEEPWARM_REDIS_PORT=16379",                    // used by scripts: names no key, ignored
		"KEEPWARM_POSTGRES_URL=postgres://elsewhere/x", // used by tests: ignored
		"KEEPWARM_REDIS_USERNAME=",                     // empty: ignored
		"OTHER_REDIS_DB=9",
	)
	checks := []struct {
		name      string
		got, want any
	}{
		{"postgres.dsn", c.Postgres.DSN, "postgres://kw:pw@db.internal:5432/app?sslmode=verify-full"},
		{"redis.password", c.Redis.Password.Value(), "from-env"},
		{"redis.db", c.Redis.DB, 3},
		{"redis.tls.enabled", c.Redis.TLS.Enabled, true},
		{"daemon.log_level", c.Daemon.LogLevel.String(), "DEBUG"},
		{"postgres.statement_timeout", c.Postgres.StatementTimeout, 2 * time.Second},
		{"redis.username", c.Redis.Username, ""},
	}
	for _, tt := range checks {
		if tt.got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, tt.got, tt.want)
		}
	}

	// An environment address list replaces the file's url, and the other way round.
	c = mustLoad(t, text, nil, "KEEPWARM_REDIS_ADDRESSES=10.0.0.1:6379, 10.0.0.2:6379", "KEEPWARM_REDIS_MODE=sentinel", "KEEPWARM_REDIS_MASTER_NAME=main")
	if !slices.Equal(c.Redis.Addresses, []string{"10.0.0.1:6379", "10.0.0.2:6379"}) || c.Redis.URL != "" {
		t.Errorf("KEEPWARM_REDIS_ADDRESSES: got addresses %q and url %q", c.Redis.Addresses, c.Redis.URL)
	}
	text2 := strings.Replace(cfg(map[string]string{"REDIS": `addresses = ["10.0.0.1:6379"]`}), `url = "redis://127.0.0.1:16379/0"`, "", 1)
	c = mustLoad(t, text2, nil, "KEEPWARM_REDIS_URL=redis://127.0.0.1:16379/2")
	if c.Redis.URL != "redis://127.0.0.1:16379/2" || c.Redis.Addresses != nil || c.Redis.DB != 2 {
		t.Errorf("KEEPWARM_REDIS_URL: got url %q, addresses %q, db %d", c.Redis.URL, c.Redis.Addresses, c.Redis.DB)
	}
	// ... and says so (validate prints it, run logs it).
	if want := "redis: url from KEEPWARM_REDIS_URL replaces the file's addresses (10.0.0.1:6379)"; !slices.Contains(c.Notes, want) {
		t.Errorf("notes: got %q, want %q", c.Notes, want)
	}

	// A bad value from the environment names the variable.
	_, err := load(t, text, nil, "KEEPWARM_REDIS_POOL_SIZE=lots")
	if err == nil || !strings.Contains(err.Error(), `redis: pool_size (from KEEPWARM_REDIS_POOL_SIZE): "lots" is not an integer`) {
		t.Errorf("bad env value: got %v", err)
	}
}

func TestEnvVars(t *testing.T) {
	vars := config.EnvVars()
	for name, key := range map[string]string{
		"KEEPWARM_REDIS_URL":         "redis.url",
		"KEEPWARM_REDIS_PASSWORD":    "redis.password",
		"KEEPWARM_REDIS_TLS_CA_FILE": "redis.tls.ca_file",
		"KEEPWARM_POSTGRES_DSN":      "postgres.dsn",
		"KEEPWARM_DAEMON_LISTEN":     "daemon.listen",
	} {
		if vars[name] != key {
			t.Errorf("EnvVars()[%s]: got %q, want %q", name, vars[name], key)
		}
	}
	for _, name := range []string{"KEEPWARM_REDIS_PORT", "KEEPWARM_POSTGRES_URL", "KEEPWARM_REDIS_TLS", "KEEPWARM_KEYSPACE"} {
		if _, ok := vars[name]; ok {
			t.Errorf("EnvVars() has %s, which names no scalar key", name)
		}
	}
}

func TestHotkeys(t *testing.T) {
	text := cfg(map[string]string{"REST": `
[[hotkeys]]
name = "a"
keyspace = "track"
ids = ["1", "it's \"quoted\"", "1"]
file = "lists/a.txt"

[[hotkeys]]
name = "b"
keyspace = "track"
file = "lists/b.txt"
`})
	c := mustLoad(t, text, map[string]string{
		"lists/a.txt": "# comment\n\n  2  \r\n3\n#4\n",
		"lists/b.txt": "3\nMötley Crüe\n",
	})
	if got, want := c.HotkeysList("a").IDs, []string{"1", `it's "quoted"`, "2", "3"}; !slices.Equal(got, want) {
		t.Errorf("list a: got %q, want %q", got, want)
	}
	if got, want := c.Pinned("track"), []string{"1", `it's "quoted"`, "2", "3", "Mötley Crüe"}; !slices.Equal(got, want) {
		t.Errorf("Pinned: got %q, want %q", got, want)
	}
}

func TestScheduleSpecs(t *testing.T) {
	sched := func(cron, extra string) string {
		return cfg(map[string]string{"REST": "[[schedule]]\nname = \"s\"\ncron = \"" + cron + "\"\nkeyspace = \"track\"\nids = [\"1\"]\n" + extra})
	}
	utc := time.Date(2025, 1, 1, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name, cron, extra string
		want              time.Time // next run after utc
	}{
		{"five fields", "30 10 * * *", "timezone = \"UTC\"", time.Date(2025, 1, 1, 10, 30, 0, 0, time.UTC)},
		{"seconds first", "15 0 11 * * *", "timezone = \"UTC\"", time.Date(2025, 1, 1, 11, 0, 15, 0, time.UTC)},
		{"CRON_TZ prefix", "CRON_TZ=Asia/Tokyo 0 20 * * *", "", time.Date(2025, 1, 1, 11, 0, 0, 0, time.UTC)},
		{"descriptor", "@every 10m", "", utc.Add(10 * time.Minute)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustLoad(t, sched(tt.cron, tt.extra), nil)
			if got := c.Schedules[0].Spec().Next(utc); !got.Equal(tt.want) {
				t.Errorf("Next(%s): got %s, want %s", utc, got, tt.want)
			}
		})
	}
	// Specs that robfig/cron panics on, or that never fire, are rejected with a message naming the field.
	for _, bad := range []struct{ cron, extra, want string }{
		{"TZ=UTC", "", `schedule "s": cron: "TZ=UTC" has a time zone but no schedule fields after it`},
		{"CRON_TZ=Europe/Berlin", "", `schedule "s": cron: "CRON_TZ=Europe/Berlin" has a time zone but no schedule fields`},
		{"0 0 30 2 *", "", `schedule "s": cron: "0 0 30 2 *" never fires`},
		{"0 3 * * *", `dst_gap = "later"`, `schedule "s": dst_gap: "later" is not a choice`},
	} {
		_, err := load(t, sched(bad.cron, bad.extra), nil)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("cron %q %s: got %v, want %q", bad.cron, bad.extra, err, bad.want)
		}
	}
	if c := mustLoad(t, sched("CRON_TZ=Europe/Berlin 30 2 * * *", `dst_gap = "run"`), nil); c.Schedules[0].DSTGap != config.DSTGapRun {
		t.Errorf("dst_gap: got %q, want %q", c.Schedules[0].DSTGap, config.DSTGapRun)
	}
	_, err := load(t, sched("CRON_TZ=UTC @daily", `timezone = "UTC"`), nil)
	if err == nil || !strings.Contains(err.Error(), `schedule "s": timezone: set either timezone or a CRON_TZ= prefix in cron, not both`) {
		t.Errorf("timezone twice: got %v", err)
	}
}
