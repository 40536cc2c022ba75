package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/pgserver"
	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/sources/postgres/stream"
)

// TestStreamDegradations: what the daemon reports as degraded from a change stream's status. A standby reports
// the stream's problems only; the lease holder also a stream down, or holding changes it has not applied, for
// longer than streamStallAfter.
func TestStreamDegradations(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	problem := stream.Problem{Kind: stream.ProblemRowFilter, Table: "public.track", Detail: "a row filter"}
	for _, tc := range []struct {
		name string
		role string
		st   stream.Status
		want []string // checks
	}{
		{"streaming", "holder", stream.Status{State: "streaming", Since: now.Add(-time.Hour)}, nil},
		{"reconnecting briefly", "holder", stream.Status{State: "connecting", Since: now.Add(-5 * time.Second)}, nil},
		{"down past the bound", "holder", stream.Status{State: "connecting", Since: now.Add(-streamStallAfter - time.Second), LastError: "boom"}, []string{checkStreamDown}},
		{"standby, not streaming", "standby", stream.Status{State: "stopped", Since: now.Add(-time.Hour)}, nil},
		{"lag under the bound", "holder", stream.Status{State: "streaming", Since: now.Add(-time.Hour), LagSeconds: 10, Pending: 3}, nil},
		{"not advancing", "holder", stream.Status{State: "streaming", Since: now.Add(-time.Hour), LagSeconds: 45, Pending: 3}, []string{checkStreamStalled}},
		{"a problem, on a standby too", "standby", stream.Status{State: "stopped", Problems: []stream.Problem{problem}}, []string{checkStreamProblem}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, d := range streamDegradations(tc.role, tc.st, now) {
				got = append(got, d.Check)
				if d.Detail == "" {
					t.Errorf("%s: empty detail", d.Check)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("checks %v, want %v", got, tc.want)
			}
		})
	}
}

// TestReadyzDegradedNotUnready: a fed table missing from the publication (create_publication off) is part of the
// job not done, not a daemon that cannot work: /readyz answers 200 and names it as degraded, as do
// keepwarm_degraded{check="stream_problem"}, /debug/health, the status page and `keepwarm status`. (It answered
// 503, which would take every replica out of a Service and stall a rolling update, for a catalog problem no
// restart fixes.)
func TestReadyzDegradedNotUnready(t *testing.T) {
	// Serial: `keepwarm run` sets go-redis's process-wide logger (routeRedisLogs).
	ctx := context.Background()
	pg := testenv.PrivatePostgres(t, pgserver.Options{})
	f := newPrivateDaemonFixture(t, pg)
	name := fmt.Sprintf("kwdeg_%d", time.Now().UnixNano()%1e12) // the slot's Redis keys are in the shared Redis
	dropStreamKeys(t, name)
	if err := pg.Exec(ctx, "postgres", "create table other (id int primary key); create publication "+name+" for table other"); err != nil {
		t.Fatal(err)
	}
	f.write(t, `"1"`, fmt.Sprintf(`fed_by = [{ table = "public.items", id = "id" }]
[changes]
enabled = true
slot = %q
publication = %q
create_publication = false
lease_ttl = "2s"`, name, name))
	logs, _ := startRun(t, f.path)
	addr := listenAddr(t, logs)
	var body string
	testenv.EventuallyDiag(t, 15*time.Second, "/readyz 200, degraded", withLog(logs, func() bool {
		var code int
		code, body = readyzBody(t, addr)
		return code == 200 && strings.Contains(body, "degraded") && strings.Contains(body, "public.items")
	}))
	if !strings.HasPrefix(body, "ready, degraded: change stream: public.items: not in publication \""+name+"\"") {
		t.Errorf("/readyz body %q", body)
	}
	if got := metricValue(t, addr, `keepwarm_degraded{check="stream_problem"}`); got != 1 {
		t.Errorf(`keepwarm_degraded{check="stream_problem"} = %v, want 1`, got)
	}
	_, raw := get(t, addr, "/debug/health")
	var h healthStatus
	if err := json.Unmarshal([]byte(raw), &h); err != nil || h.Ready != "ready" || len(h.Degraded) != 1 || h.Degraded[0].Check != checkStreamProblem {
		t.Errorf("/debug/health: %s (%v)", raw, err)
	}
	if _, page := get(t, addr, "/"); !strings.Contains(page, `id="degraded"`) || !strings.Contains(page, "public.items") {
		t.Errorf("the status page does not show the degradation")
	}
	out, _, code := keepwarm(t, "status", "--addr", addr)
	if code != 0 || !strings.Contains(out, "degraded (stream_problem): change stream: public.items") {
		t.Errorf("keepwarm status: exit %d\n%s", code, out)
	}
}

// TestReloadFollowsARenamedFedColumn: a migration renames the fed_by column and the config follows it. The
// stream kept decoding with the columns it started with, so updates were never applied (and /readyz said 200
// with nothing to see). Now the rename is reported as degraded at the table's next change, and the reload
// reconfigures the stream at once: the next update of a cached key lands without a restart.
func TestReloadFollowsARenamedFedColumn(t *testing.T) {
	// Serial: `keepwarm run` sets go-redis's process-wide logger (routeRedisLogs).
	ctx := context.Background()
	pg := testenv.PrivatePostgres(t, pgserver.Options{})
	f := newPrivateDaemonFixture(t, pg)
	rdb := testenv.Redis(t)
	if err := pg.Exec(ctx, "postgres", "alter table items add column ref text; update items set ref = id; alter table items replica identity full"); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("kwrename_%d", time.Now().UnixNano()%1e12) // the slot's Redis keys are in the shared Redis
	dropStreamKeys(t, name)
	feeds := func(col string) string {
		return fmt.Sprintf(`fed_by = [{ table = "public.items", id = %q }]
[changes]
enabled = true
slot = %q
publication = %q
lease_ttl = "2s"`, col, name, name)
	}
	f.write(t, `"1"`, feeds("ref"))
	logs, _ := startRun(t, f.path)
	addr := listenAddr(t, logs)
	key := func(id string) string { return f.prefix + "item:" + id }
	testenv.EventuallyDiag(t, 15*time.Second, "the stream started", withLog(logs, func() bool {
		return strings.Contains(logs.String(), "change stream started")
	}))
	if err := pg.Exec(ctx, "postgres", "alter table items rename column ref to item_ref; update items set body = '{\"v\": 1}' where id = '2'"); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyDiag(t, 15*time.Second, "the renamed column reported as degraded", withLog(logs, func() bool {
		code, body := readyzBody(t, addr)
		return code == 200 && strings.Contains(body, `fed_by column "ref"`)
	}))
	f.write(t, `"1"`, feeds("item_ref"))
	testenv.EventuallyDiag(t, 15*time.Second, "the reload reconfigured the stream", withLog(logs, func() bool {
		return strings.Contains(logs.String(), "feeds changed; reconnecting")
	}))
	testenv.EventuallyDiag(t, 15*time.Second, "resynced and streaming again", withLog(logs, func() bool {
		return strings.Contains(logs.String(), "reason=reconfigured") && metricValue(t, addr, "keepwarm_stream_streaming") == 1
	}))
	if err := rdb.Set(ctx, key("3"), "old", time.Hour).Err(); err != nil { // as an app's miss path would
		t.Fatal(err)
	}
	if err := pg.Exec(ctx, "postgres", `update items set body = '{"v": "renamed"}' where id = '3'`); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyDiag(t, 15*time.Second, "the update after the reload in Redis", withLog(logs, func() bool {
		return strings.Contains(rdb.Get(ctx, key("3")).Val(), `"renamed"`)
	}))
	testenv.EventuallyDiag(t, 15*time.Second, "no longer degraded", withLog(logs, func() bool {
		code, body := readyzBody(t, addr)
		return code == 200 && body == "ready\n"
	}))
}
