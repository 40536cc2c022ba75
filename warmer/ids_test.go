package warmer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/warmer"
)

// logLines collects a logger's output, one record per line, safely for concurrent writers.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, string(p))
	return len(p), nil
}

// count returns how many lines contain every one of subs.
func (l *logLines) count(subs ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
line:
	for _, s := range l.lines {
		for _, sub := range subs {
			if !strings.Contains(s, sub) {
				continue line
			}
		}
		n++
	}
	return n
}

func (l *logLines) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// hotIDs returns the sorted ids of the only keyspace's hot keys.
func hotIDs(w *warmer.Warmer) []string {
	st := w.Status(0)
	if len(st) != 1 {
		return nil
	}
	var ids []string
	for _, k := range st[0].Keys {
		ids = append(ids, k.ID)
	}
	slices.Sort(ids)
	return ids
}

// sortedIDs returns the ids from..to as sorted strings, as hotIDs returns them.
func sortedIDs(from, to int) []string {
	ids := idRange(from, to)
	slices.Sort(ids)
	return ids
}

// addInvalid puts n members that are not valid ids (invalid UTF-8, as in `\xff\xfe1`) into the access set with
// the given score, as any client that can ZINCRBY could.
func addInvalid(t *testing.T, rdb *redis.Client, key string, n int, score float64) {
	t.Helper()
	ctx := context.Background()
	for start := 0; start < n; start += 1000 {
		var zs []redis.Z
		for i := start; i < min(start+1000, n); i++ {
			zs = append(zs, redis.Z{Score: score, Member: fmt.Sprintf("\xff\xfe%d", i)})
		}
		if err := rdb.ZAdd(ctx, key, zs...).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestInvalidAccessMembersNeverTakeHotSlots: with top_n = 50, 60 access-set members that are not valid ids must
// not push the 50 real ids out of the hot set, whether they score above the real ids or among the ones a full
// sync reads, with or without min_score. They are removed from the set and each is counted once.
func TestInvalidAccessMembersNeverTakeHotSlots(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		minScore     float64
		invalidScore float64
	}{
		{"above the real ids", 0, 1000},
		{"above the real ids, with min_score", 5, 1000},
		{"below the real ids", 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, 60)
			ctx := context.Background()
			cfg := f.config()
			cfg.TopN, cfg.MinScore = 50, tc.minScore
			addInvalid(t, f.rdb, cfg.AccessKey, 60, tc.invalidScore)
			for i := 1; i <= 50; i++ {
				f.rdb.ZAdd(ctx, cfg.AccessKey, redis.Z{Score: 10, Member: fmt.Sprint(i)})
			}
			w, reg, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
			want := sortedIDs(1, 50)
			testenv.Eventually(t, 5*time.Second, "the 50 real ids are the hot set", func() bool {
				return slices.Equal(hotIDs(w), want)
			})
			testenv.Eventually(t, 5*time.Second, "invalid members removed from the access set", func() bool {
				return f.rdb.ZCard(ctx, cfg.AccessKey).Val() == 50
			})
			labels := map[string]string{"keyspace": "items", "source": "access_set"}
			if got := counter(t, reg, "keepwarm_warmer_invalid_ids_total", labels); got != 60 {
				t.Errorf("keepwarm_warmer_invalid_ids_total%v = %v, want 60", labels, got)
			}
			for _, k := range w.Status(0)[0].Keys {
				if !utf8.ValidString(k.ID) {
					t.Errorf("hot id %q is not a valid id", k.ID)
				}
			}
		})
	}
}

// TestInvalidAccessMembersLogOnce: 6,000 invalid members (which once wrote 43 MB of WARN lines in 20 s) give one
// summary line, not a line per id per poll, while the 10 real ids become hot on the first polls.
func TestInvalidAccessMembersLogOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 20)
	ctx := context.Background()
	cfg := f.config()
	cfg.TopN = 50
	addInvalid(t, f.rdb, cfg.AccessKey, 6000, 1000)
	for i := 1; i <= 10; i++ {
		f.rdb.ZAdd(ctx, cfg.AccessKey, redis.Z{Score: 10, Member: fmt.Sprint(i)})
	}
	logs := &logLines{}
	w, reg, stop := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Logger: logs.logger()})
	want := sortedIDs(1, 10)
	testenv.Eventually(t, 10*time.Second, "the 10 real ids are the hot set", func() bool {
		return slices.Equal(hotIDs(w), want)
	})
	testenv.Eventually(t, 10*time.Second, "invalid members removed from the access set", func() bool {
		return f.rdb.ZCard(ctx, cfg.AccessKey).Val() == 10
	})
	labels := map[string]string{"keyspace": "items", "source": "access_set"}
	if got := counter(t, reg, "keepwarm_warmer_invalid_ids_total", labels); got != 6000 {
		t.Errorf("keepwarm_warmer_invalid_ids_total%v = %v, want 6000", labels, got)
	}
	// Let the real ids be refreshed a few times (every refresh batch used to log each invalid hot id), then stop
	// so that no more lines arrive while counting.
	testenv.Eventually(t, 10*time.Second, "real ids refreshed", func() bool {
		return counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"result": "ok"}) >= 30
	})
	stop()
	// One summary per keyspace per minute: the test runs well inside a minute on a quiet machine, but a busy
	// one may cross into a second interval.
	if n := logs.count("invalid ids"); n < 1 || n > 2 {
		t.Errorf("%d log lines about invalid ids, want 1 (2 if the test crossed a minute)", n)
	}
	if n := logs.count("level=WARN"); n > 2 {
		t.Errorf("%d WARN lines, want at most 2:\n%s", n, strings.Join(logs.lines[:min(len(logs.lines), 5)], ""))
	}
	if n := len(logs.lines); n > 50 {
		t.Errorf("%d log lines in all, want O(1) whatever the number of invalid members", n)
	}
}

// TestLFUFreshKeysDoNotOutrankAccess: under an LFU policy, keys nobody has read carry Redis's initial counter
// (LFU_INIT_VAL, 5). They must not outrank ids with measured access, here access scores 3 and 2.
func TestLFUFreshKeysDoNotOutrankAccess(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 200)
	f.rdb = testenv.PrivateRedis(t)
	setConfig(t, f.rdb, "maxmemory-policy", "allkeys-lfu")
	setConfig(t, f.rdb, "lfu-log-factor", "0")
	ctx := context.Background()
	for i := 101; i <= 120; i++ { // written (by a warmup, say) and never read: OBJECT FREQ 5
		f.rdb.Set(ctx, f.key(fmt.Sprint(i)), "v", time.Minute)
	}
	cfg := f.config()
	cfg.TopN, cfg.LFU, cfg.LFUScanCount = 2, true, 1_000_000
	f.rdb.ZAdd(ctx, cfg.AccessKey, redis.Z{Score: 3, Member: "1"}, redis.Z{Score: 2, Member: "2"})
	w, _, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	testenv.Eventually(t, 5*time.Second, "ids 1 and 2 (measured access) are the hot set", func() bool {
		return slices.Equal(hotIDs(w), []string{"1", "2"})
	})
}

// TestLFUPolicySwitchAtRuntime: an LFU keyspace on a Redis whose maxmemory-policy is not LFU notices a runtime
// switch to allkeys-lfu (and back) without a restart.
func TestLFUPolicySwitchAtRuntime(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 20)
	f.rdb = testenv.PrivateRedis(t)
	setConfig(t, f.rdb, "maxmemory-policy", "noeviction")
	setConfig(t, f.rdb, "lfu-log-factor", "0")
	cfg := f.config()
	cfg.TopN, cfg.LFU, cfg.LFUScanCount = 2, true, 1_000_000
	cfg.LFUCheckEvery = 100 * time.Millisecond
	logs := &logLines{}
	w, _, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Logger: logs.logger()})
	testenv.Eventually(t, 5*time.Second, "lfu signal reported off", func() bool { return logs.count("lfu signal off") == 1 })

	ctx := context.Background()
	if err := f.rdb.ConfigSet(ctx, "maxmemory-policy", "allkeys-lfu").Err(); err != nil {
		t.Fatal(err)
	}
	// Counters are only meaningful for accesses made under the LFU policy, so the keys are written after the switch.
	for i, id := range []string{"1", "2", "3", "4"} {
		f.rdb.Set(ctx, f.key(id), "app", time.Minute)
		for n := 0; n < 40*(4-i); n++ { // 1 read most, 4 least
			f.rdb.Get(ctx, f.key(id))
		}
	}
	testenv.Eventually(t, 5*time.Second, "the two most-read keys are hot after the switch to LFU", func() bool {
		return slices.Equal(hotIDs(w), []string{"1", "2"})
	})
	if st := w.Status(0); !st[0].LFU {
		t.Error("Status: LFU = false under allkeys-lfu")
	}

	if err := f.rdb.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "lfu signal off after the switch back", func() bool {
		return !w.Status(0)[0].LFU && logs.count("lfu signal off") == 2
	})
	if n := logs.count("lfu signal on"); n != 1 {
		t.Errorf("%d \"lfu signal on\" lines, want 1: the periodic check logs changes only", n)
	}
}

// TestKeyStatusJSONEscapesInvalidBytes: /debug/hotkeys encodes KeyStatus; invalid UTF-8 must come out escaped
// (\xff), not as U+FFFD, so two different bad ids stay distinguishable, and a valid id that merely looks escaped
// stays apart from them.
func TestKeyStatusJSONEscapesInvalidBytes(t *testing.T) {
	t.Parallel()
	decode := func(ks warmer.KeyStatus) map[string]any {
		t.Helper()
		b, err := json.Marshal(ks)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), `\ufffd`) || strings.ContainsRune(string(b), 0xFFFD) {
			t.Errorf("JSON %s has U+FFFD", b)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	for _, tc := range []struct {
		name, id, wantID string
		escaped          bool
	}{
		{"invalid 1", "\xff\xfe1", `\xff\xfe1`, true},
		{"invalid 2", "\xff\xfd1", `\xff\xfd1`, true},
		{"valid lookalike", `\xff\xfe1`, `\xff\xfe1`, false},
		{"valid", "42", "42", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := decode(warmer.KeyStatus{ID: tc.id, Key: "item:" + tc.id})
			if got := m["id"]; got != tc.wantID {
				t.Errorf("id = %q, want %q", got, tc.wantID)
			}
			if got := m["key"]; got != "item:"+tc.wantID {
				t.Errorf("key = %q, want %q", got, "item:"+tc.wantID)
			}
			got, _ := m["id_escaped"].(bool)
			if got != tc.escaped {
				t.Errorf("id_escaped = %v, want %v", got, tc.escaped)
			}
			if _, ok := m["ttl_ns"]; !ok {
				t.Errorf("the other fields are lost: %v", m)
			}
		})
	}
}
