package warmer_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/warmer"
)

// changesFixture is a Warmer (not running: Changes works without Run, as Warmup does) with Changes feeding the
// fixture's keyspace from its table.
func changesFixture(t *testing.T, onChange string, pinned ...string) (*fixture, *warmer.Warmer, *warmer.Changes, *prometheus.Registry) {
	t.Helper()
	f := newFixture(t, 20)
	reg := prometheus.NewRegistry()
	w, err := warmer.New(f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{f.config(pinned...)}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	c, err := warmer.NewChanges(w, warmer.ChangesConfig{Registerer: reg, Keyspaces: []warmer.ChangeKeyspace{
		{Keyspace: "items", OnChange: onChange, Feeds: []warmer.Feed{{Table: "t.items", Column: "id"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	return f, w, c, reg
}

func rowChange(id string) warmer.RowChange {
	return warmer.RowChange{Table: "t.items", New: map[string]string{"id": id}}
}

func (f *fixture) setBody(t *testing.T, id string, v int) {
	t.Helper()
	if _, err := f.pool.Exec(context.Background(), "update "+f.table+" set body = jsonb_build_object('id', id::int, 'v', $2::int) where id = $1", id, v); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) get(t *testing.T, id string) string {
	t.Helper()
	v, err := f.rdb.Get(context.Background(), f.key(id)).Result()
	if errors.Is(err, redis.Nil) {
		return "<none>"
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestChangesCoalesceAndLeaveUncachedAlone: 500 updates of one row in one batch are one rebuild; an id that is
// not cached is not queried; a row whose id column moved refreshes both ids.
func TestChangesCoalesceAndLeaveUncachedAlone(t *testing.T) {
	t.Parallel()
	f, w, c, reg := changesFixture(t, "")
	ctx := context.Background()
	if _, err := w.Warmup(ctx, "items", warmer.SliceIDs([]string{"1", "2", "5"}), warmer.WarmupOptions{}); err != nil {
		t.Fatal(err)
	}
	f.setBody(t, "1", 500)
	f.setBody(t, "2", 2)
	f.setBody(t, "5", 5)
	before := f.src.count("1")
	var txns []warmer.Txn
	for i := 0; i < 500; i++ {
		txns = append(txns, warmer.Txn{Commit: time.Now(), Changes: []warmer.RowChange{rowChange("1")}})
	}
	txns = append(txns, warmer.Txn{Commit: time.Now(), Changes: []warmer.RowChange{
		rowChange("3"), // not cached: left alone
		{Table: "t.items", Old: map[string]string{"id": "2"}, New: map[string]string{"id": "5"}}, // both ids
		{Table: "other.table", New: map[string]string{"id": "4"}},                                // not a feed
	}})
	if err := c.Apply(ctx, txns); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if got := f.src.count("1") - before; got != 1 {
		t.Errorf("origin queries of id 1 for 500 changes: got %d, want 1 (coalesced)", got)
	}
	if got := f.src.count("3"); got != 0 {
		t.Errorf("origin queries of uncached id 3: got %d, want 0", got)
	}
	for id, want := range map[string]string{"1": `"v": 500`, "2": `"v": 2`, "5": `"v": 5`} {
		if got := f.get(t, id); !strings.Contains(got, want) {
			t.Errorf("key %s: got %s, want it to contain %s", id, got, want)
		}
	}
	if got := f.get(t, "3"); got != "<none>" {
		t.Errorf("key 3: got %s, want none (not cached before the change)", got)
	}
	if got := counter(t, reg, "keepwarm_changes_applied_total", map[string]string{"result": warmer.ChangeNotCached}); got != 1 {
		t.Errorf("applied{result=not_cached}: got %v, want 1", got)
	}
	if got := counter(t, reg, "keepwarm_changes_commit_to_redis_seconds", nil); got != 501 {
		t.Errorf("commit-to-Redis observations: got %v, want 501 (one per transaction)", got)
	}
	if probs, err := testutil.GatherAndLint(reg); err != nil || len(probs) > 0 {
		t.Errorf("metrics lint: %v %v", probs, err)
	}
}

// TestChangeBeatsInFlightRebuild is the invalidation race with on_change = refresh and no app-side delete: an
// app's rebuild read the row before the commit and publishes after the change was applied. It must not
// resurrect the old row: the change revoked its lock, so its publish fails (ErrLockGone).
func TestChangeBeatsInFlightRebuild(t *testing.T) {
	t.Parallel()
	for _, onChange := range []string{warmer.OnChangeRefresh, warmer.OnChangeInvalidate} {
		t.Run(onChange, func(t *testing.T) {
			f, w, c, _ := changesFixture(t, onChange)
			ctx := context.Background()
			if _, err := w.Warmup(ctx, "items", warmer.SliceIDs([]string{"7"}), warmer.WarmupOptions{}); err != nil {
				t.Fatal(err)
			}
			ks := f.keySet(t, "7")
			// The app: takes the lock and reads the old row.
			token := lockstep.NewToken()
			if ok, err := lockstep.Acquire(ctx, f.rdb, ks.Lock, token, 10*time.Second); err != nil || !ok {
				t.Fatalf("app acquire: %v %v", ok, err)
			}
			old := f.get(t, "7")
			// The write commits, and the change is applied while the app's rebuild is in flight.
			f.setBody(t, "7", 77)
			if err := c.Apply(ctx, []warmer.Txn{{Commit: time.Now(), Changes: []warmer.RowChange{rowChange("7")}}}); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			// The app publishes what it read before the commit.
			res, err := lockstep.PublishMany(ctx, f.rdb, []lockstep.Write{{Keys: ks, Token: token, Value: []byte(old), TTL: 10 * time.Second}})
			if err != nil {
				t.Fatal(err)
			}
			if !errors.Is(res[0].Err, lockstep.ErrLockGone) && !errors.Is(res[0].Err, lockstep.ErrLockLost) {
				t.Errorf("app's late publish: got %v, want ErrLockGone or ErrLockLost", res[0].Err)
			}
			got := f.get(t, "7")
			switch onChange {
			case warmer.OnChangeRefresh:
				if !strings.Contains(got, `"v": 77`) {
					t.Errorf("key after the race: got %s, want the committed row (v 77)", got)
				}
			case warmer.OnChangeInvalidate:
				if got != "<none>" {
					t.Errorf("key after the race: got %s, want none (invalidated; the next read rebuilds)", got)
				}
			}
		})
	}
}

// TestChangesRejectsBadConfig: unknown keyspaces and on_change values are named.
func TestChangesRejectsBadConfig(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	w, err := warmer.New(f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{f.config()}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = warmer.NewChanges(w, warmer.ChangesConfig{Keyspaces: []warmer.ChangeKeyspace{
		{Keyspace: "nope", Feeds: []warmer.Feed{{Table: "t.a", Column: "id"}}},
		{Keyspace: "items", OnChange: "delete", Feeds: []warmer.Feed{{Table: "t.a"}}},
	}})
	for _, want := range []string{`keyspace "nope": unknown keyspace`, `keyspace "items": on_change: "delete"`, `keyspace "items": fed_by[0]`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("NewChanges: got %v, want it to contain %q", err, want)
		}
	}
}

// A resync owed at start-up (the slot was created, or lost while the daemon was down) waits for each keyspace's
// first poll: a snapshot of the hot set taken alongside that poll would cover 0 keys. Called before the warmer
// runs, it covers every hot key once the warmer has looked.
func TestResyncWaitsForTheFirstPoll(t *testing.T) {
	t.Parallel()
	_, w, c, reg := changesFixture(t, "", "1", "2", "3", "4", "5")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Resync(ctx, "created") }()
	runDone := make(chan error, 1)
	go func() { runDone <- w.Run(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Resync: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Resync did not return within 20 s of the warmer's start")
	}
	if got := counter(t, reg, "keepwarm_changes_resync_keys_total", nil); got != 5 {
		t.Errorf("resync covered %v hot keys, want the 5 pinned ones", got)
	}
	cancel()
	<-runDone
}

// After a TRUNCATE every cached key of the fed keyspaces is known wrong, hot or not. A resync that refreshed the
// hot keys only would leave cold cached rows serving truncated data, so the cold ones are invalidated too (SCAN of
// the key template), and the hot ones refreshed, not deleted.
func TestResyncAfterTruncateInvalidatesColdKeys(t *testing.T) {
	t.Parallel()
	f, w, c, _ := changesFixture(t, "", "1", "2")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Cold cached keys, written by apps: not hot (only 1 and 2 are pinned).
	for id := 3; id <= 12; id++ {
		if err := f.rdb.Set(ctx, f.key(strconv.Itoa(id)), "cached by an app", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	other := f.prefix + "unrelated"
	if err := f.rdb.Set(ctx, other, "x", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- w.Run(ctx) }()
	if err := c.Resync(ctx, warmer.ResyncTruncate); err != nil {
		t.Fatalf("Resync: %v", err)
	}
	for id := 3; id <= 12; id++ {
		if got := f.get(t, strconv.Itoa(id)); got != "<none>" {
			t.Errorf("cold key %d after the truncate's resync: %s, want it invalidated", id, got)
		}
	}
	// A hot key's refresh may find its lock taken by the warmer's own first-poll rebuild, begun after the
	// resync revoked the old lock (ResultLocked): that rebuild reads the committed rows and writes the key
	// soon after Resync returns (a CI run saw both keys still absent at the return).
	for _, id := range []string{"1", "2"} {
		testenv.Eventually(t, 10*time.Second, "hot key "+id+" refreshed after the truncate's resync", func() bool {
			return f.get(t, id) != "<none>"
		})
	}
	if f.rdb.Exists(ctx, other).Val() != 1 {
		t.Errorf("a key outside the keyspace's template was deleted")
	}
	cancel()
	<-runDone
}

// TestChangesCountLateKeys: the freshness SLO counts a changed key published more than Freshness after its commit
// became visible (here the commit time: the fixture's source does not wait for visibility), once per key, with
// its staleness; a key published in time, and an id that is not cached, are not counted.
func TestChangesCountLateKeys(t *testing.T) {
	t.Parallel()
	_, w, c, reg := changesFixture(t, "")
	ctx := context.Background()
	if _, err := w.Warmup(ctx, "items", warmer.SliceIDs([]string{"1", "2", "3"}), warmer.WarmupOptions{}); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	txns := []warmer.Txn{
		{Commit: now.Add(-5 * time.Second), Changes: []warmer.RowChange{rowChange("1"), rowChange("4")}}, // 4: not cached
		{Commit: now.Add(-4 * time.Second), Changes: []warmer.RowChange{rowChange("1"), rowChange("2")}},
		{Commit: now, Changes: []warmer.RowChange{rowChange("3")}},
	}
	if err := c.Apply(ctx, txns); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if got := counter(t, reg, "keepwarm_changes_late_total", map[string]string{"keyspace": "items"}); got != 2 {
		t.Errorf("late keys: got %v, want 2 (ids 1 and 2; 3 was in time, 4 not cached)", got)
	}
	// id 1 is dated from the first transaction that changed it (5 s ago), id 2 from 4 s ago.
	stale := counter(t, reg, "keepwarm_changes_stale_seconds_total", map[string]string{"keyspace": "items"})
	if elapsed := time.Since(now).Seconds(); stale < 9 || stale > 9+2*elapsed {
		t.Errorf("stale seconds: got %.3f, want 9 to %.3f", stale, 9+2*elapsed)
	}
	if got := counter(t, reg, "keepwarm_changes_visible_to_redis_seconds", nil); got != 3 {
		t.Errorf("visible-to-Redis observations: got %v, want 3 (one per transaction)", got)
	}
}
