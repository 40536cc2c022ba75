package soak_test

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/benchload"
	"github.com/keepwarm/keepwarm/internal/soak"
)

// kill9Seed seeds TestFleetSurvivesKill9's schedule and load. At one minute, seed 5004 kills r2 at 10 s (down
// 1.9 s) and r3 at 32 s (down 1.3 s). Replay another with `go test -run TestFleetSurvivesKill9 ./internal/soak
// -args -kill9-seed N`.
var kill9Seed = flag.Uint64("kill9-seed", 5004, "TestFleetSurvivesKill9's seed")

// TestFleetSurvivesKill9 runs a real fleet (3 daemon processes on the Chinook demo, private redis-server and
// PostgreSQL, the soak's Zipf load) for the shortest soak, with kill -9 of one replica as its only fault, at the
// demo config's defaults. It passes when no hot key is missing for more than 1 s and every gap of at least
// 100 ms is counted by the SLO counter and logged for its own key by some replica, with no phantom count: the
// promise of docs/operations.md, "What a kill -9 still costs, by design, and what it must not". It takes about
// two minutes; the daemons' logs stay in the directory the soak prints.
func TestFleetSurvivesKill9(t *testing.T) {
	o := soak.DefaultOptions()
	o.Duration = time.Minute
	o.Seed = *kill9Seed
	o.Replicas = 3
	o.Faults = "daemon-kill9"
	o.MaxUnlogged, o.MaxUncounted = 0, 0
	o.MaxGap = time.Second
	o.Config = filepath.Join(benchload.ModuleRoot(), "config.toml")
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	err := soak.Run(ctx, o, os.Stdout, os.Stderr)
	var ce *soak.ChecksError
	switch {
	case errors.As(err, &ce):
		for _, f := range ce.Failed {
			t.Errorf("seed %d: %s", ce.Seed, f)
		}
	case err != nil:
		t.Fatalf("seed %d: %v (the soak needs redis-server, PostgreSQL and toxiproxy: make services)", o.Seed, err)
	}
}
