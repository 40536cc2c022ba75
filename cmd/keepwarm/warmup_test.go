package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/keepwarm/keepwarm/internal/assemble"
	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/internal/testenv"
)

// prefixedDemoConfig copies the demo config with every key template prefixed, so the test's keys never meet
// the demo's or another test's.
func prefixedDemoConfig(t *testing.T, prefix string) string {
	t.Helper()
	b, err := os.ReadFile(demoConfig)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, ks := range []string{"track", "album", "artist", "chart:genre"} {
		s = strings.Replace(s, `key = "`+ks+`:${id}"`, `key = "`+prefix+ks+`:${id}"`, 1)
	}
	list, err := filepath.Abs(filepath.Join(filepath.Dir(demoConfig), "examples/hotkeys/black-friday.txt"))
	if err != nil {
		t.Fatal(err)
	}
	s = strings.Replace(s, `file = "examples/hotkeys/black-friday.txt"`, `file = "`+list+`"`, 1)
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestWarmupWritesWhatFetchShows warms each Chinook demo keyspace and checks that Redis holds, byte for byte,
// what the source returns for the same ids (what `keepwarm fetch` prints).
func TestWarmupWritesWhatFetchShows(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	t.Setenv("KEEPWARM_POSTGRES_DSN", chinookDSN(t))
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	path := prefixedDemoConfig(t, prefix)
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := assemble.Postgres(context.Background(), cfg, connectTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	srcs, err := assemble.Sources(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ keyspace, ids string }{
		{"track", "1,2,3,3503,99999"}, {"album", "1,5,347"}, {"artist", "1,22"}, {"chart-genre", "1,2,25"},
	} {
		t.Run(tt.keyspace, func(t *testing.T) {
			stdout, stderr, code := keepwarm(t, "warmup", "--config", path, "--keyspace", tt.keyspace, "--ids", tt.ids)
			if code != 0 {
				t.Fatalf("warmup: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
			ids := strings.Split(tt.ids, ",")
			want, missing, err := srcs[tt.keyspace].Fetch(context.Background(), ids)
			if err != nil {
				t.Fatal(err)
			}
			ks := cfg.Keyspace(tt.keyspace).Keys()
			for id, v := range want {
				set, _ := ks.For(id)
				got, err := rdb.Get(context.Background(), set.Cache).Bytes()
				if err != nil {
					t.Fatalf("%s: %v", set.Cache, err)
				}
				if string(got) != string(v) {
					t.Errorf("%s: Redis holds %q, fetch shows %q", set.Cache, got, v)
				}
			}
			for _, id := range missing {
				set, _ := ks.For(id)
				if n := rdb.Exists(context.Background(), set.Cache).Val(); n != 0 {
					t.Errorf("%s: missing at the origin but written", set.Cache)
				}
			}
			wantLine := "written " + strconv.Itoa(len(want)) + "  skipped (locked) 0  missing " + strconv.Itoa(len(missing)) + "  failed 0"
			if !strings.Contains(stdout, wantLine) {
				t.Errorf("summary lacks %q:\n%s", wantLine, stdout)
			}
		})
	}
}

func TestWarmupUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"no keyspace", []string{"warmup", "--config", demoConfig, "--ids", "1"}, "--keyspace is required"},
		{"two id sources", []string{"warmup", "--config", demoConfig, "--keyspace", "track", "--ids", "1", "--query"}, "exactly one of"},
		{"unknown keyspace", []string{"warmup", "--config", demoConfig, "--keyspace", "nope", "--ids", "1"}, `keyspace "nope" is not in`},
		{"unknown list", []string{"warmup", "--config", demoConfig, "--keyspace", "track", "--list", "nope"}, `no [[hotkeys]] list named "nope"`},
		{"negative spread", []string{"warmup", "--config", demoConfig, "--keyspace", "track", "--ids", "1", "--spread", "-1s"}, "must not be negative"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, stderr, code := keepwarm(t, tt.args...)
			if code != 2 || !strings.Contains(stderr, tt.want) {
				t.Errorf("exit %d, stderr %q; want exit 2 and %q", code, stderr, tt.want)
			}
		})
	}
}

func TestWarmupDryRun(t *testing.T) {
	t.Parallel()
	stdout, stderr, code := keepwarm(t, "warmup", "--config", demoConfig, "--keyspace", "track", "--list", "front-page",
		"--spread", "10m", "--dry-run")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"dry run (nothing queried or written) of keyspace track", "ids 5 in 1 batches", "projected TTLs"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, stdout)
		}
	}
}
