package main

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// TestStrategyTable: every stampede strategy has a unique name, a description and a start, and --strategies all
// runs them in the table's order.
func TestStrategyTable(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, st := range stampedeStrategies {
		if st.name == "" || st.desc == "" || st.start == nil {
			t.Errorf("strategy %+v: want a name, a description and a start", st.name)
		}
		if seen[st.name] {
			t.Errorf("strategy %q listed twice", st.name)
		}
		seen[st.name] = true
	}
	c, err := parseStampede([]string{"--strategies", "all"}, new(testWriter))
	if err != nil {
		t.Fatalf("parse --strategies all: %v", err)
	}
	if got, want := len(c.strategies), len(stampedeStrategies); got != want {
		t.Fatalf("--strategies all: got %d strategies, want %d", got, want)
	}
	for i, st := range c.strategies {
		if got, want := st.name, stampedeStrategies[i].name; got != want {
			t.Errorf("--strategies all: strategy %d is %q, want %q", i, got, want)
		}
	}
	if _, err := parseStampede([]string{"--strategies", "fetch,nope"}, new(testWriter)); err == nil {
		t.Error("--strategies fetch,nope: got no error, want an unknown-strategy error")
	}
}

type testWriter struct{}

func (testWriter) Write(p []byte) (int, error) { return len(p), nil }

// TestReferenceStrategies runs the four reference readers against the shared Redis with an in-memory recompute
// that blocks until released. Four readers of a missing key all miss; without the lock (fetch, xfetch) all four
// recompute at once, with it (locked, xlocked) one recomputes while the other three contend for the lock and
// wait; then every reader returns without error and the next read hits.
func TestReferenceStrategies(t *testing.T) {
	t.Parallel()
	prefix := testenv.Prefix(t, testenv.Redis(t))
	for _, tt := range []struct {
		name           string
		wantRecomputes int64 // at once, by 4 concurrent readers of a missing key
		wantContention bool
	}{
		{"fetch", 4, false},
		{"locked", 1, true},
		{"xfetch", 4, false},
		{"xlocked", 1, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st, ok := strategyByName(tt.name)
			if !ok {
				t.Fatalf("no strategy %q", tt.name)
			}
			var inflight atomic.Int64
			release := make(chan struct{})
			recompute := func(ctx context.Context) ([]byte, error) {
				inflight.Add(1)
				defer inflight.Add(-1)
				<-release
				return []byte("v"), nil
			}
			const workers = 4
			rdb := testenv.Redis(t)
			cmds := testenv.CountCommands(rdb)
			var checked atomic.Int64
			e := &stampedeEnv{c: stampedeConfig{workers: workers, expiry: time.Minute, lockTTL: 10 * time.Second, beta: 1}, app: rdb,
				checked: func() { checked.Add(1) }}
			setup, err := st.start(context.Background(), &strategyRun{stampedeEnv: e, name: tt.name,
				prefix: prefix + tt.name + ":", recompute: recompute, origin: &origin{}, cnt: &stampedeCounters{},
				measuring: new(atomic.Bool)})
			if err != nil {
				t.Fatalf("start: %v", err)
			}
			defer setup.release()
			if got := len(setup.readers); got != workers {
				t.Fatalf("got %d readers, want %d", got, workers)
			}
			outs := make([]readOutcome, workers)
			var wg sync.WaitGroup
			for i, read := range setup.readers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					outs[i] = read(context.Background())
				}()
			}
			// Release the recomputes once every reader has looked at the empty key and recomputes or waits for the
			// lock (a SET NX; nothing else sends SET before a recompute returns). Counting SETs alone was not
			// enough: a loser retries its SET NX every lockPoll, so on a loaded machine three readers reached the
			// count while the fourth had not read yet, and it then found the value (a hit, not the miss wanted).
			testenv.Eventually(t, 10*time.Second, "every reader recomputing or waiting for the lock", func() bool {
				n := inflight.Load()
				return checked.Load() == workers && (n == workers || n == 1 && cmds.Count("set") >= workers)
			})
			if got := inflight.Load(); got != tt.wantRecomputes {
				t.Errorf("recomputes at once: got %d, want %d", got, tt.wantRecomputes)
			}
			close(release)
			wg.Wait()
			contended := false
			for i, o := range outs {
				if o.err != nil {
					t.Errorf("reader %d: %v", i, o.err)
				}
				if !o.miss {
					t.Errorf("reader %d: got no miss, want one (the key was empty)", i)
				}
				contended = contended || o.contention
			}
			if contended != tt.wantContention {
				t.Errorf("lock contention: got %v, want %v", contended, tt.wantContention)
			}
			if o := setup.readers[0](context.Background()); o.err != nil || o.miss {
				t.Errorf("read after the recompute: got miss %v, error %v; want a hit", o.miss, o.err)
			}
		})
	}
}
