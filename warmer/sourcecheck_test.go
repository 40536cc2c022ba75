package warmer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/sources/postgres"
	"github.com/keepwarm/keepwarm/warmer"
)

// TestKeyspaceCheckRetriedWithBackoff: a keyspace whose query names a table that does not exist yet does not
// stop the warmer. The healthy keyspace refreshes; Failing and Status name the broken one and its error; once the
// table exists the broken keyspace starts refreshing; a keyspace removed by Update stops being checked.
func TestKeyspaceCheckRetriedWithBackoff(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 5)
	ctx := context.Background()
	things := strings.Replace(f.table, `"items"`, `"things"`, 1)
	broken := func() warmer.KeyspaceConfig {
		src, err := postgres.New(f.pool, postgres.Config{Keyspace: "things",
			Query: "select id, body from " + things + " where id = any($1)", StatementTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		keys, err := lockstep.NewKeys(f.prefix+"thing:${id}", "", "", "")
		if err != nil {
			t.Fatal(err)
		}
		c := f.config("2")
		c.Name, c.Keys, c.Src, c.AccessKey = "things", keys, src, f.prefix+"access-things"
		return c
	}
	good := f.config("1")
	good.Src = f.source(t, "select id, body from "+f.table+" where id = any($1)") // a Checker, like the daemon's
	w, _, _ := start(t, f.rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{good, broken()}})

	testenv.Eventually(t, 10*time.Second, "the healthy keyspace's pinned key written", func() bool {
		return f.rdb.Exists(ctx, f.key("1")).Val() == 1
	})
	testenv.Eventually(t, 10*time.Second, "the broken keyspace reported failing", func() bool { return len(w.Failing()) > 0 })
	failing := w.Failing()
	if len(failing) != 1 || failing[0].Keyspace != "things" || !strings.Contains(failing[0].Error, "does not exist") ||
		failing[0].Attempts < 1 || failing[0].NextCheck.Before(failing[0].Since) {
		t.Fatalf("Failing() = %+v; want keyspace things with its does-not-exist error", failing)
	}
	for _, st := range w.Status(0) {
		if got := st.CheckError != ""; got != (st.Name == "things") {
			t.Errorf("Status of %s: CheckError = %q", st.Name, st.CheckError)
		}
	}

	if _, err := f.pool.Exec(ctx, "create table "+things+" as select i::text as id, jsonb_build_object('thing', i) as body from generate_series(1, 5) i"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the recovered keyspace's pinned key written", func() bool {
		return f.rdb.Exists(ctx, f.prefix+"thing:2").Val() == 1
	})
	if failing := w.Failing(); len(failing) != 0 {
		t.Errorf("Failing() after recovery = %+v, want none", failing)
	}

	// A keyspace that fails again after a reload, then is removed by the next one, is no longer reported.
	if _, err := f.pool.Exec(ctx, "drop table "+things); err != nil {
		t.Fatal(err)
	}
	again := broken()
	again.Keys, _ = lockstep.NewKeys(f.prefix+"thing2:${id}", "", "", "") // a new layout: a new keyspace that is checked
	if err := w.Update([]warmer.KeyspaceConfig{good, again}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the re-added keyspace reported failing", func() bool { return len(w.Failing()) == 1 })
	if err := w.Update([]warmer.KeyspaceConfig{good}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the removed keyspace no longer reported", func() bool { return len(w.Failing()) == 0 })
}
