package config_test

import (
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/config"
)

// Configs that `run` cannot start on (it would exit, never become ready, or run a warmup every second), which
// `validate` must refuse too: Load, the function both commands call, refuses each with a message that names the
// field (and the environment variable that set it).
func TestLoadRefusesWhatRunCannotStartOn(t *testing.T) {
	sched := func(cron, extra string) string {
		return cfg(map[string]string{"REST": "[[schedule]]\nname = \"s\"\ncron = \"" + cron + "\"\nkeyspace = \"track\"\nids = [\"1\"]\n" + extra})
	}
	tests := []struct {
		name string
		text string
		env  []string
		want string
	}{
		{"derived stale_ttl above the limit",
			strings.Replace(cfg(map[string]string{"KEYSPACE": `stale = "s:${id}"`}), `ttl = "30s"`, `ttl = "879h"`, 1), nil,
			`keyspace "track": stale_ttl: the default 10 × ttl (879h0m0s) = 8790h0m0s is above the limit`},
		{"redis read_timeout 1ns", cfg(map[string]string{"REDIS": `read_timeout = "1ns"`}), nil,
			`redis: read_timeout: 1ns is below the floor of 1ms`},
		{"redis write_timeout 1ns", cfg(map[string]string{"REDIS": `write_timeout = "1ns"`}), nil,
			`redis: write_timeout: 1ns is below the floor of 1ms`},
		{"redis dial_timeout 1ns", cfg(map[string]string{"REDIS": `dial_timeout = "1ns"`}), nil,
			`redis: dial_timeout: 1ns is below the floor of 100ms`},
		{"postgres connect_timeout 1ms", cfg(map[string]string{"POSTGRES": `connect_timeout = "1ms"`}), nil,
			`postgres: connect_timeout: 1ms is below the floor of 100ms`},
		{"postgres pool_wait_timeout 1ns", cfg(map[string]string{"POSTGRES": `pool_wait_timeout = "1ns"`}), nil,
			`postgres: pool_wait_timeout: 1ns is below the floor of 10ms`},
		{"read_timeout from the environment", cfg(nil), []string{"KEEPWARM_REDIS_READ_TIMEOUT=1ns"},
			`redis: read_timeout (from KEEPWARM_REDIS_READ_TIMEOUT): 1ns is below the floor of 1ms`},
		{"connect_timeout from the environment", cfg(nil), []string{"KEEPWARM_POSTGRES_CONNECT_TIMEOUT=1ms"},
			`postgres: connect_timeout (from KEEPWARM_POSTGRES_CONNECT_TIMEOUT): 1ms is below the floor of 100ms`},
		{"listen on a host that is no address", cfg(map[string]string{"DAEMON": `listen = "256.0.0.1:9471"`}), nil,
			`daemon: listen: "256.0.0.1:9471": host "256.0.0.1" is not an IPv4 address`},
		{"listen on a name that does not resolve", cfg(map[string]string{"DAEMON": `listen = "no-such-host.invalid:9471"`}), nil,
			`daemon: listen: "no-such-host.invalid:9471": host "no-such-host.invalid" does not resolve`},
		{"@every 0s", sched("@every 0s", ""), nil,
			`schedule "s": cron: "@every 0s" fires every 1s, more often than the floor of 1m0s`},
		{"@every -1s", sched("@every -1s", ""), nil, `schedule "s": cron: "@every -1s" fires every 1s`},
		{"@every 1ns", sched("@every 1ns", ""), nil, `schedule "s": cron: "@every 1ns" fires every 1s`},
		{"every second as a spec", sched("* * * * * *", ""), nil, `schedule "s": cron: "* * * * * *" fires every 1s`},
		{"twice a minute", sched("0,30 0 3 * * *", ""), nil, `schedule "s": cron: "0,30 0 3 * * *" fires every 30s`},
		{"below a lowered floor", sched("@every 5s", `min_interval = "10s"`), nil,
			`schedule "s": cron: "@every 5s" fires every 5s, more often than the floor of 10s`},
		{"a floor below a second", sched("@every 5s", `min_interval = "500ms"`), nil,
			`schedule "s": min_interval: 500ms is below the floor of 1s`},
		// Found by trying mutated configs against run after the first fixes.
		{"a pool too large to allocate", cfg(map[string]string{"REDIS": `pool_size = 2147483647`}), nil,
			`redis: pool_size: 2147483647 is not in [0, 100000]`},
		{"redis url port out of range", strings.Replace(cfg(nil), "127.0.0.1:16379", "127.0.0.1:99999", 1), nil,
			`redis: url: address "127.0.0.1:99999" is not host:port with a port in [1, 65535]`},
		{"redis url port 0", strings.Replace(cfg(nil), "127.0.0.1:16379", "127.0.0.1:0", 1), nil,
			`redis: url: address "127.0.0.1:0" is not host:port`},
		{"listen on an address of another host", cfg(map[string]string{"DAEMON": `listen = "192.0.2.1:0"`}), nil,
			`daemon: listen: "192.0.2.1:0": host "192.0.2.1" is not an address of this host`},
		{"listen on a broadcast address", cfg(map[string]string{"DAEMON": `listen = "255.255.255.255:0"`}), nil,
			`host "255.255.255.255" is a multicast or broadcast address`},
		{"listen on a multicast address", cfg(map[string]string{"DAEMON": `listen = "224.0.0.1:0"`}), nil,
			`host "224.0.0.1" is a multicast or broadcast address`},
		{"listen with a zone of no interface", cfg(map[string]string{"DAEMON": `listen = "[fe80::1%nonexist]:0"`}), nil,
			`host "fe80::1%nonexist" is not an address of this host`},
		{"a bare nan rate", sched("@daily", "rate = nan"), nil, `schedule "s": rate: NaN is not a finite number`},
		{"a bare inf jitter", cfg(map[string]string{"KEYSPACE": `jitter = inf`}), nil, `keyspace "track": jitter: +Inf is not a finite number`},
		{"a hot-key list that is a device", cfg(map[string]string{"REST": "[[hotkeys]]\nname = \"h\"\nkeyspace = \"track\"\nfile = \"/dev/zero\""}), nil,
			`hotkeys "h": file: /dev/zero: is not a regular file`},
		{"redis url with a negative database", strings.Replace(cfg(nil), "redis://127.0.0.1:16379/0", "redis://127.0.0.1:16379/-1", 1), nil,
			`redis: url: the database number in its path is -1`},
		{"cluster mode from the environment", cfg(nil), []string{"KEEPWARM_REDIS_MODE=cluster"},
			`keyspace "track": KEEPWARM_REDIS_MODE=cluster: key template "track:${id}": no fixed Redis Cluster hash tag`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := load(t, tt.text, nil, tt.env...)
			if err == nil {
				t.Fatalf("LoadEnv accepted it (%d schedules), want an error containing %q", len(c.Schedules), tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("LoadEnv: got\n\t%v\nwant an error containing\n\t%s", err, tt.want)
			}
		})
	}
}

// The floors leave room for every sensible setting, and a lowered schedule floor allows what it says.
func TestFloorsAcceptSensibleSettings(t *testing.T) {
	c := mustLoad(t, cfg(map[string]string{
		"REDIS":    "read_timeout = \"1ms\"\nwrite_timeout = \"1ms\"\ndial_timeout = \"100ms\"",
		"POSTGRES": "connect_timeout = \"100ms\"\npool_wait_timeout = \"10ms\"",
		"DAEMON":   `listen = "localhost:0"`,
		"REST":     "[[schedule]]\nname = \"s\"\ncron = \"@every 10s\"\nmin_interval = \"10s\"\nkeyspace = \"track\"\nids = [\"1\"]\n",
	}), nil)
	if c.Redis.ReadTimeout != time.Millisecond || c.Postgres.PoolWaitTimeout != 10*time.Millisecond {
		t.Errorf("read_timeout %v, pool_wait_timeout %v: want 1ms and 10ms", c.Redis.ReadTimeout, c.Postgres.PoolWaitTimeout)
	}
	if got := c.Schedules[0].Spec().MinInterval(); got != 10*time.Second {
		t.Errorf("MinInterval: got %v, want 10s", got)
	}
	if d := mustLoad(t, cfg(map[string]string{"REST": "[[schedule]]\nname = \"s\"\ncron = \"0 3 * * *\"\nkeyspace = \"track\"\nids = [\"1\"]\n"}), nil); d.Schedules[0].Spec().MinInterval() != 24*time.Hour {
		t.Errorf("daily: MinInterval %v, want 24h", d.Schedules[0].Spec().MinInterval())
	}
}

// A run whose local time a spring-forward skips runs right after the gap unless dst_gap = "skip", so that a
// pre-promotion warmup at 02:00 America/Los_Angeles does not silently skip that day.
func TestDSTGapDefaultsToRun(t *testing.T) {
	text := cfg(map[string]string{"REST": "[[schedule]]\nname = \"s\"\ncron = \"CRON_TZ=America/Los_Angeles 0 2 * * *\"\nkeyspace = \"track\"\nids = [\"1\"]\n"})
	if c := mustLoad(t, text, nil); c.Schedules[0].DSTGap != config.DSTGapRun {
		t.Errorf("dst_gap: got %q, want %q by default", c.Schedules[0].DSTGap, config.DSTGapRun)
	}
	if c := mustLoad(t, text+"dst_gap = \"skip\"\n", nil); c.Schedules[0].DSTGap != config.DSTGapSkip {
		t.Errorf("dst_gap: got %q, want %q as set", c.Schedules[0].DSTGap, config.DSTGapSkip)
	}
}

// A UTF-8 byte order mark (Notepad writes one) is not content: the file loads as without it.
func TestByteOrderMark(t *testing.T) {
	c := mustLoad(t, "\xef\xbb\xbf"+cfg(nil), nil)
	if len(c.Keyspaces) != 1 || c.Keyspaces[0].Name != "track" {
		t.Errorf("keyspaces: got %d, want the one named track", len(c.Keyspaces))
	}
}

// An environment url naming another database than the file's db wins, with a note, as it wins over the file's
// addresses (the demo config sets db = 0; KEEPWARM_REDIS_URL=redis://host:port/15 was refused as "db: 0 differs
// from the url's database 15", without saying where the url came from).
func TestEnvURLDatabaseReplacesTheFilesDB(t *testing.T) {
	c := mustLoad(t, cfg(map[string]string{"REDIS": "db = 0"}), nil, "KEEPWARM_REDIS_URL=redis://127.0.0.1:16379/15")
	if c.Redis.DB != 15 {
		t.Errorf("db: got %d, want 15 from the environment's url", c.Redis.DB)
	}
	if want := "redis: database 15 from KEEPWARM_REDIS_URL replaces the file's db = 0"; !slices.Contains(c.Notes, want) {
		t.Errorf("notes %q, want %q", c.Notes, want)
	}
	// Both in the file: still a contradiction to fix.
	_, err := load(t, strings.Replace(cfg(map[string]string{"REDIS": "db = 3"}), "16379/0", "16379/15", 1), nil)
	if err == nil || !strings.Contains(err.Error(), "redis: db: 3 differs from the url's database 15") {
		t.Errorf("file db 3, file url /15: got %v", err)
	}
}

// A hot-key list that is a FIFO is refused at once: opening it would block until some writer came.
func TestHotkeysFileThatIsAFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "ids.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := config.LoadEnv(write(t, cfg(map[string]string{"REST": "[[hotkeys]]\nname = \"h\"\nkeyspace = \"track\"\nfile = \"" + fifo + "\""}), nil), nil)
		done <- err
	}()
	select {
	case err := <-done:
		if want := `hotkeys "h": file: ` + fifo + `: is not a regular file`; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("LoadEnv: got %v, want %q", err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("LoadEnv blocked on the FIFO")
	}
}
