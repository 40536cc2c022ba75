package warmer_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/sources/postgres"
	"github.com/keepwarm/keepwarm/warmer"
)

// fetchOnly hides every method of a source but Fetch (no ValidID): an id the source would refuse at the door gets
// through to a batch, as a data error the doors cannot foresee does.
type fetchOnly struct{ warmer.Source }

// TestNULAccessMemberSkipped: an access-set member with a NUL byte (valid UTF-8, so lockstep accepts
// it, but no PostgreSQL text can hold it) is skipped at the door like any invalid id: removed from the set,
// counted, logged in the summary. The real ids are hot and written, and the origin is never taken for failing.
func TestNULAccessMemberSkipped(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 20)
	ctx := context.Background()
	cfg := f.config()
	cfg.TopN = 10
	for i := 1; i <= 5; i++ {
		f.rdb.ZAdd(ctx, cfg.AccessKey, redis.Z{Score: 10, Member: fmt.Sprint(i)})
	}
	f.rdb.ZAdd(ctx, cfg.AccessKey, redis.Z{Score: 100, Member: "3\x00"})
	logs := &logLines{}
	w, reg, stop := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Logger: logs.logger()})
	want := sortedIDs(1, 5)
	testenv.Eventually(t, 5*time.Second, "ids 1-5, and only they, are the hot set", func() bool {
		return slices.Equal(hotIDs(w), want)
	})
	testenv.Eventually(t, 5*time.Second, "ids 1-5 written to Redis", func() bool {
		return f.rdb.Exists(ctx, f.key("1"), f.key("2"), f.key("3"), f.key("4"), f.key("5")).Val() == 5
	})
	if got := f.rdb.ZScore(ctx, cfg.AccessKey, "3\x00").Err(); got != redis.Nil {
		t.Errorf("the NUL member is still in the access set (ZSCORE: %v), want it removed", got)
	}
	labels := map[string]string{"keyspace": "items", "source": "access_set"}
	if got := counter(t, reg, "keepwarm_warmer_invalid_ids_total", labels); got != 1 {
		t.Errorf("keepwarm_warmer_invalid_ids_total%v = %v, want 1", labels, got)
	}
	if got := f.src.count("3\x00"); got != 0 {
		t.Errorf("the NUL id was asked of the origin %d times, want 0", got)
	}
	stop()
	if got := counter(t, reg, "keepwarm_warmer_origin_queries_total", map[string]string{"result": "error"}); got != 0 {
		t.Errorf("origin queries failed: %v, want 0", got)
	}
	if n := logs.count("origin failing"); n != 0 {
		t.Errorf("%d \"origin failing\" lines, want 0", n)
	}
	if n := logs.count("skipped invalid ids", `example="\"3\\x00\""`); n != 1 {
		t.Errorf("%d summary lines about invalid ids naming the NUL id, want 1:\n%s", n, strings.Join(logs.lines, ""))
	}
}

// TestNULChangeSkipped: a change whose id holds a NUL byte, in a batch with valid ids, is skipped and
// counted as an invalid id; the other ids are refreshed and Apply succeeds (otherwise the whole batch would fail in
// PostgreSQL, and the stream would retry it forever).
func TestNULChangeSkipped(t *testing.T) {
	t.Parallel()
	f, w, c, reg := changesFixture(t, warmer.OnChangeRefresh)
	ctx := context.Background()
	if _, err := w.Warmup(ctx, "items", warmer.SliceIDs([]string{"1", "2"}), warmer.WarmupOptions{}); err != nil {
		t.Fatal(err)
	}
	// A cached key for the NUL id (any app can write one), so that the change is worth refreshing.
	f.rdb.Set(ctx, f.key("2\x00"), "app's", time.Minute)
	f.setBody(t, "1", 100)
	f.setBody(t, "2", 200)
	err := c.Apply(ctx, []warmer.Txn{{Commit: time.Now(), Changes: []warmer.RowChange{rowChange("1"), rowChange("2\x00"), rowChange("2")}}})
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	for id, want := range map[string]string{"1": `"v": 100`, "2": `"v": 200`} {
		if got := f.get(t, id); !strings.Contains(got, want) {
			t.Errorf("key %s: got %s, want it to contain %s", id, got, want)
		}
	}
	if got := counter(t, reg, "keepwarm_changes_applied_total", map[string]string{"result": warmer.ChangeInvalidID}); got != 1 {
		t.Errorf("applied{result=invalid_id}: got %v, want 1", got)
	}
	labels := map[string]string{"keyspace": "items", "source": "changes"}
	if got := counter(t, reg, "keepwarm_warmer_invalid_ids_total", labels); got != 1 {
		t.Errorf("keepwarm_warmer_invalid_ids_total%v = %v, want 1", labels, got)
	}
	if got := f.src.count("2\x00"); got != 0 {
		t.Errorf("the NUL id was asked of the origin %d times, want 0", got)
	}
}

// TestBadInputBatchIsSplit: when a batch's query still fails on one id with a data error, the batch is
// split until that id is alone: the other ids of the batch are written to Redis, the bad id is counted as an
// invalid id (source origin) and a bad_input refresh error, retried with back-off rather than in a loop, and the
// keyspace is not reported as failing: no "origin failing" line, no failed origin query, no RefreshFailing entry.
//   - "cast": the keyspace's query casts ids to int, and "abc" raises 22P02 in PostgreSQL.
//   - "NUL past the door, simple_protocol": the source's ValidID is hidden from the warmer, so a pinned NUL id
//     reaches Fetch, whose own check refuses the batch; in simple_protocol mode the id would have cost the
//     connection (08P01) had it been sent.
func TestBadInputBatchIsSplit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, mode, bad string
		query           string
	}{
		{"cast", "", "abc", "select ids.id, t.body from unnest($1::text[]) as ids(id) join %s t on t.id::int = ids.id::int"},
		{"NUL past the door, simple_protocol", "simple_protocol", "3\x00", "select id, body from %s where id = any($1::text[])"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, 20)
			pool := f.pool
			if tc.mode != "" {
				var err error
				pool, err = postgres.NewPool(context.Background(), testenv.PostgresURL()+"&default_query_exec_mode="+tc.mode, 4, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(pool.Close)
			}
			src, err := postgres.New(pool, postgres.Config{Keyspace: "items", Query: fmt.Sprintf(tc.query, f.table), StatementTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			f.src = &countingSource{src: fetchOnly{src}}
			good := []string{"1", "2", "3", "4", "5", "6", "7"}
			cfg := f.config(append(slices.Clone(good), tc.bad)...)
			cfg.TopN = 0
			logs := &logLines{}
			w, reg, stop := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Logger: logs.logger()})
			ctx := context.Background()
			keys := make([]string, len(good))
			for i, id := range good {
				keys[i] = f.key(id)
			}
			testenv.Eventually(t, 5*time.Second, "the good ids of the batch written to Redis", func() bool {
				return f.rdb.Exists(ctx, keys...).Val() == int64(len(keys))
			})
			if got := f.rdb.Exists(ctx, f.key(tc.bad)).Val(); got != 0 {
				t.Errorf("the bad id's key exists, want it never written")
			}
			// Let every good key be refreshed twice more while the bad one is retried.
			testenv.Eventually(t, 10*time.Second, "the good ids refreshed again", func() bool {
				return counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"result": "ok"}) >= float64(3*len(good))
			})
			if got := w.RefreshFailing(); len(got) != 0 {
				t.Errorf("RefreshFailing = %+v, want none: one bad id does not make the keyspace fail", got)
			}
			stop()
			// The bad id is retried with back-off up to max(ttl/2, 1s), about as often as a good id is refreshed
			// (every ttl - lead): a loop would retry it many times as often, whatever the machine's speed.
			bad := counter(t, reg, "keepwarm_warmer_refresh_errors_total", map[string]string{"reason": "bad_input"})
			perGood := counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"result": "ok"}) / float64(len(good))
			t.Logf("bad_input refreshes %v, ok refreshes per good id %.1f", bad, perGood)
			if bad < 1 || bad > 2*perGood+3 {
				t.Errorf("refresh errors with reason bad_input: %v for %.1f refreshes of each good id, want 1 to %.0f (the bad id retried with back-off)",
					bad, perGood, 2*perGood+3)
			}
			labels := map[string]string{"keyspace": "items", "source": "origin"}
			if got := counter(t, reg, "keepwarm_warmer_invalid_ids_total", labels); got != bad {
				t.Errorf("keepwarm_warmer_invalid_ids_total%v = %v, want %v (one per bad_input refresh)", labels, got, bad)
			}
			if got := counter(t, reg, "keepwarm_warmer_refresh_errors_total", map[string]string{"reason": "origin"}); got != 0 {
				t.Errorf("refresh errors with reason origin: %v, want 0", got)
			}
			if got := counter(t, reg, "keepwarm_warmer_origin_queries_total", map[string]string{"result": "error"}); got != 0 {
				t.Errorf("origin queries counted as errors: %v, want 0 (a data error is bad_input)", got)
			}
			if got := counter(t, reg, "keepwarm_warmer_failsafe_extensions_total", nil); got != 0 {
				t.Errorf("fail-safe extensions: %v, want 0", got)
			}
			if n := logs.count("origin failing"); n != 0 {
				t.Errorf("%d \"origin failing\" lines, want 0:\n%s", n, strings.Join(logs.lines, ""))
			}
			if n := logs.count("skipped invalid ids", "origin="); n < 1 {
				t.Errorf("no summary line counting the bad id (origin=...):\n%s", strings.Join(logs.lines, ""))
			}
		})
	}
}

// TestNULPinnedIDRefused: warmer.New refuses a pinned id that the source cannot hold, naming the field.
func TestNULPinnedIDRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	_, err := warmer.New(f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{f.config("1", "2\x00")}})
	if err == nil || !strings.Contains(err.Error(), `keyspace "items": pinned: postgres: invalid id`) {
		t.Errorf("New: got %v, want the pinned NUL id refused", err)
	}
}

// TestBadInputChangeSplit: a change batch whose query fails on one id with a data error (22P02 from a
// cast) applies the other changes; the bad id is counted as invalid_id, its cached value (stale since the change)
// is invalidated, and Apply succeeds rather than failing the batch for the stream to retry forever.
func TestBadInputChangeSplit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 20)
	f.src = &countingSource{src: f.source(t, "select ids.id, t.body from unnest($1::text[]) as ids(id) join "+f.table+" t on t.id::int = ids.id::int")}
	reg := prometheus.NewRegistry()
	w, err := warmer.New(f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{f.config()}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	c, err := warmer.NewChanges(w, warmer.ChangesConfig{Registerer: reg, Keyspaces: []warmer.ChangeKeyspace{
		{Keyspace: "items", OnChange: warmer.OnChangeRefresh, Feeds: []warmer.Feed{{Table: "t.items", Column: "id"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := w.Warmup(ctx, "items", warmer.SliceIDs([]string{"1", "2"}), warmer.WarmupOptions{}); err != nil {
		t.Fatal(err)
	}
	f.rdb.Set(ctx, f.key("abc"), "stale", time.Minute)
	f.setBody(t, "1", 100)
	f.setBody(t, "2", 200)
	err = c.Apply(ctx, []warmer.Txn{{Commit: time.Now(), Changes: []warmer.RowChange{rowChange("1"), rowChange("abc"), rowChange("2")}}})
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	for id, want := range map[string]string{"1": `"v": 100`, "2": `"v": 200`} {
		if got := f.get(t, id); !strings.Contains(got, want) {
			t.Errorf("key %s: got %s, want it to contain %s", id, got, want)
		}
	}
	if got := f.get(t, "abc"); got != "<none>" {
		t.Errorf("key abc: got %s, want it invalidated", got)
	}
	if got := counter(t, reg, "keepwarm_changes_applied_total", map[string]string{"result": warmer.ChangeInvalidID}); got != 1 {
		t.Errorf("applied{result=invalid_id}: got %v, want 1", got)
	}
	labels := map[string]string{"keyspace": "items", "source": "origin"}
	if got := counter(t, reg, "keepwarm_warmer_invalid_ids_total", labels); got != 1 {
		t.Errorf("keepwarm_warmer_invalid_ids_total%v = %v, want 1", labels, got)
	}
}
