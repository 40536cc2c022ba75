package config_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/keepwarm/keepwarm/internal/config"
)

// TestKeyspaceFieldsAreDocumented: every [[keyspace]] key has its type, default and doc in the one table.
func TestKeyspaceFieldsAreDocumented(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range config.KeyspaceFields() {
		if f.Key == "" || f.Type == "" || f.Default == "" || f.Doc == "" {
			t.Errorf("field %q: want Key, Type, Default and Doc, got %+v", f.Key, f)
		}
		if seen[f.Key] {
			t.Errorf("field %q is listed twice", f.Key)
		}
		seen[f.Key] = true
	}
}

// TestKeyspaceFieldBounds: for every key whose table entry states a bound, a value outside it is refused with
// a problem naming the key, so that the stated bound and the checks (the decoder's or warmer's Resolve's) agree.
func TestKeyspaceFieldBounds(t *testing.T) {
	outside := map[string]string{
		"name":                   `name = "-track"`,
		"key":                    `key = "track"`,
		"ttl":                    `ttl = "9000h"`,
		"jitter":                 `jitter = 1.5`,
		"refresh_ahead":          `refresh_ahead = 1`,
		"lock_ttl":               `lock_ttl = "5s"`, // not above [postgres] statement_timeout (5s)
		"stale_ttl":              `stale_ttl = "1h"`,
		"max_stale":              `max_stale = "9000h"`,
		"query":                  `query = "select 1"`,
		"ids_query":              `ids_query = "select $1"`,
		"missing":                `missing = "drop"`,
		"tombstone_value":        `tombstone_value = "gone"`,
		"tombstone_ttl":          `tombstone_ttl = "1m"`,
		"batch_size":             `batch_size = 100001`,
		"max_origin_concurrency": `max_origin_concurrency = -1`,
		"origin_rate":            `origin_rate = -1`,
		"top_n":                  `top_n = 1000001`,
		"min_score":              `min_score = -1`,
		"max_value_bytes":        `max_value_bytes = 536870913`,
		"max_tracked":            `max_tracked = 999`, // below the default top_n, 1000
		"decay_half_life":        `decay_half_life = "9000h"`,
		"history_half_life":      `history_half_life = "1m"`, // below the default decay_half_life, 10m
		"on_change":              `on_change = "later"`,
		"fed_by":                 `fed_by = [{ table = "track" }]`,
		"reconcile_budget":       `reconcile_budget = -1`,
	}
	for _, f := range config.KeyspaceFields() {
		if f.Bound == "" {
			continue
		}
		t.Run(f.Key, func(t *testing.T) {
			t.Parallel()
			line, ok := outside[f.Key]
			if !ok {
				t.Fatalf("no value outside the bound %q to try: add one", f.Bound)
			}
			text := cfg(map[string]string{"KEYSPACE": line})
			if f.Key == "name" || f.Key == "key" || f.Key == "ttl" || f.Key == "query" {
				text = strings.Replace(cfg(nil), "\n"+f.Key+" = ", "\n"+line+"\n#"+f.Key+" = ", 1)
			}
			_, err := load(t, text, nil)
			if err == nil {
				t.Fatalf("%s: Load accepted it, want a problem naming %s (bound: %s)", line, f.Key, f.Bound)
			}
			if !strings.Contains(err.Error(), f.Key) {
				t.Errorf("%s: got %v, want a problem naming %s", line, err, f.Key)
			}
		})
	}
}

// TestRedactedKeyspacesLoadBack: the printout of the keyspaces, written by walking the same table as the
// decoder, loads back to the same effective values (and prints the same again).
func TestRedactedKeyspacesLoadBack(t *testing.T) {
	for name, text := range map[string]string{
		"demo": "",
		"every key set": cfg(map[string]string{
			"KEYSPACE": `lock = "l:${key}"
stale = "s:${key}"
meta = "m:${key}"
keep_meta = true
jitter = 0.3
refresh_ahead = "25%"
lock_ttl = "12s"
stale_ttl = "10m"
max_stale = "1m"
ids_query = "select '1'"
missing = "tombstone"
tombstone_value = "null"
tombstone_ttl = "5s"
batch_size = 7
max_origin_concurrency = 3
origin_rate = 2.5
top_n = 0
min_score = 0
max_value_bytes = 0
max_tracked = 20
decay_half_life = "1m"
history_half_life = "5m"
lfu = true
on_change = "invalidate"
fed_by = [{ table = "track", id = "track_id" }]
reconcile_budget = 5`,
			"REST": "[changes]\nenabled = true\n"}),
		"a refresh_ahead duration": cfg(map[string]string{"KEYSPACE": `refresh_ahead = "3s"`}),
	} {
		t.Run(name, func(t *testing.T) {
			var c *config.Config
			if text == "" {
				var err error
				if c, err = config.LoadEnv("../../config.toml", nil); err != nil {
					t.Fatal(err)
				}
			} else {
				c = mustLoad(t, text, nil)
			}
			printed := c.Redacted()
			// [redis.tls] is left out: it prints its empty file keys, which then count as set (a gap of that
			// section's printer, not of the keyspaces').
			tls := regexp.MustCompile(`(?s)\n\[redis\.tls\]\n.*?\n\n`)
			dir := t.TempDir()
			p := filepath.Join(dir, "printed.toml")
			if err := os.WriteFile(p, []byte(tls.ReplaceAllString(printed, "\n")), 0o644); err != nil {
				t.Fatal(err)
			}
			again, err := config.LoadEnv(p, nil)
			if err != nil {
				t.Fatalf("loading the printout: %v\n%s", err, printed)
			}
			if len(again.Keyspaces) != len(c.Keyspaces) {
				t.Fatalf("keyspaces: got %d, want %d", len(again.Keyspaces), len(c.Keyspaces))
			}
			for i, ks := range c.Keyspaces {
				for _, f := range config.KeyspaceFields() {
					got, want := fmt.Sprint(f.Value(again.Keyspaces[i])), fmt.Sprint(f.Value(ks))
					if got != want {
						t.Errorf("keyspace %q: %s: got %s after printing, want %s", ks.Name, f.Key, got, want)
					}
				}
			}
			if got := again.Redacted(); got != printed {
				t.Errorf("printed twice:\n%s\nonce:\n%s", got, printed)
			}
		})
	}
}
