package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// TestFleetScaleRuns runs fleet-scale small on the shared Redis Cluster (`make cluster`), deleting only its own
// keys: two replicas keep 3,000 pinned keys warm, a third joins and leaves. It checks what the benchmark's
// figures rest on, not speed: every replica refreshed in the window; the join moved about 1/3 of the keys
// (rendezvous hashing), and the leave moved exactly the keys the join had (each goes back to its former owner);
// both settled.
func TestFleetScaleRuns(t *testing.T) {
	testenv.Cluster(t) // fails with how to start the cluster when it is not up
	c := fleetScaleConfig{addrs: testenv.ClusterAddrs(), hot: 3000, ttl: 2 * time.Second,
		replicas: []int{2}, window: 2 * time.Second, valueBytes: 50, batch: 100, notify: false,
		prefix: fmt.Sprintf("kwbfs%d", time.Now().UnixNano()), flush: false}
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := fleetScale(ctx, c, &out, &errOut)
	if err != nil {
		t.Fatalf("fleet-scale: %v\n%s", err, errOut.String())
	}
	if len(rep.Runs) != 1 {
		t.Fatalf("%d runs, want 1", len(rep.Runs))
	}
	r := rep.Runs[0]
	if len(r.PerReplicaPerSec) != 2 {
		t.Fatalf("rates of %d replicas, want 2", len(r.PerReplicaPerSec))
	}
	for i, p := range r.PerReplicaPerSec {
		if p <= 0 {
			t.Errorf("replica %d refreshed nothing in the %.1fs window", i, r.Window)
		}
	}
	if r.Join == nil || r.Leave == nil {
		t.Fatalf("join %v, leave %v: want both", r.Join, r.Leave)
	}
	if f := r.Join.Fraction; math.Abs(f-1.0/3) > 0.05 {
		t.Errorf("join moved %.3f of the keys, want about 1/3", f)
	}
	if r.Leave.Moved != r.Join.Moved {
		t.Errorf("leave moved %d keys, join %d: the leaver's keys should go back to their former owners", r.Leave.Moved, r.Join.Moved)
	}
	if !strings.Contains(out.String(), "keys moved") {
		t.Errorf("no membership table in the output:\n%s", out.String())
	}
}
