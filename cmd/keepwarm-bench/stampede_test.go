package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// TestStampedeQuickKeepwarm runs `keepwarm-bench stampede --quick --strategies keepwarm` (50 workers, one hot
// key, 5 s expiry, 200 ms pg_sleep recompute, 20 s measured) and asserts the keepwarm targets of
// docs/benchmarks.md: no miss, no simultaneous recompute, no client-side lock contention, and one recompute per
// expiry (±1), every one of them the daemon's, as PostgreSQL itself logged them. Latency is reported, never
// asserted: timing is for the benchmark command.
//
// The expiry is 5 s rather than 4 s because the warmer refreshes a value lead + e before it expires, where lead is
// at least 3× the measured rebuild p95 (≈ 0.7 s here, more on a loaded CI machine) and e ≤ lead/2: with 4 s the
// refresh period (≈ 4.2 s × jitter − lead − e ≈ 3.3 s) gives 6–7 refreshes in 20 s against the 5 ± 1 wanted; with
// 5 s it gives 4–5 against 4 ± 1.
func TestStampedeQuickKeepwarm(t *testing.T) {
	testenv.Redis(t)
	schema := testenv.Schema(t, testenv.Postgres(t))
	var stdout, stderr bytes.Buffer
	c, err := parseStampede([]string{"--quick", "--strategies", "keepwarm", "--schema", schema,
		"--redis", testenv.RedisURL(), "--postgres", testenv.PostgresURL()}, &stderr)
	if err != nil {
		t.Fatalf("parse flags: %v", err)
	}
	rep, err := stampede(context.Background(), c, &stdout, &stderr)
	t.Logf("\n%s", stdout.String())
	if err != nil {
		t.Fatalf("stampede: %v\n%s", err, stderr.String())
	}
	if len(rep.Results) != 1 {
		t.Fatalf("got %d result rows, want 1", len(rep.Results))
	}
	r := rep.Results[0]
	want := int64(c.duration / c.expiry)
	for _, check := range []struct {
		name      string
		got       int64
		lo, hi    int64
		condition string
	}{
		{"samples", r.Samples, 1, 1 << 62, "> 0"},
		{"errors", r.Errors, 0, 0, "0"},
		{"misses", r.Misses, 0, 0, "0"},
		{"stale serves", r.Stale, 0, 0, "0"},
		{"simultaneous recomputes", r.Simultaneous, 0, 0, "0"},
		{"client lock contentions", r.Contentions, 0, 0, "0"},
		{"recomputes", r.Recomputes, want - 1, want + 1, "duration/expiry ±1"},
		{"recomputes by apps", r.Recomputes - r.DaemonRecomputes, 0, 0, "0"},
		{"origin queries logged by PostgreSQL from apps", r.OriginApp, 0, 0, "0"},
		{"origin queries logged by PostgreSQL from the daemon", r.OriginDaemon, want - 1, want + 1, "duration/expiry ±1"},
		{"overlapping origin queries", r.OriginOverlap, 0, 0, "0"},
	} {
		if check.got < check.lo || check.got > check.hi {
			t.Errorf("%s: got %d, want %s", check.name, check.got, check.condition)
		}
	}
}
