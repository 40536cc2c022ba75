package warmer

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/keepwarm/keepwarm/lockstep"
)

// TestLease: the daemon's lock lease is a quarter of the keyspace's smallest lead, at least minLease and at most
// lock_ttl.
func TestLease(t *testing.T) {
	t.Parallel()
	keys, err := lockstep.NewKeys("lease:${id}", "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name                                  string
		ttl, refreshAhead, lockTTL, statement time.Duration
		want                                  time.Duration
	}{
		{"demo: lead 2s", 10 * time.Second, 2 * time.Second, 10 * time.Second, 1500 * time.Millisecond, 500 * time.Millisecond},
		{"long lead", time.Minute, 8 * time.Second, 10 * time.Second, time.Second, 2 * time.Second},
		{"lead raised to the statement timeout", time.Minute, time.Second, 10 * time.Second, 4 * time.Second, time.Second},
		{"floor", 2 * time.Second, 600 * time.Millisecond, 2 * time.Second, 500 * time.Millisecond, minLease},
		{"capped by lock_ttl", time.Hour, 20 * time.Minute, 2 * time.Second, time.Second, 2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := KeyspaceConfig{Name: "k", Keys: keys, TTL: tt.ttl, RefreshAhead: tt.refreshAhead,
				LockTTL: tt.lockTTL, StatementTimeout: tt.statement}.Resolve()
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			if got := cfg.lease(); got != tt.want {
				t.Errorf("lease() = %v with lead %v, lock_ttl %v; want %v", got, cfg.Lead(0), cfg.LockTTL, tt.want)
			}
		})
	}
}

// TestLeaseGivenUpBeforeItLapses: with renewals that do not get through, the batch gives its keys up once no
// renewal sent in the last 3/4 of a lease has succeeded, before the lease can have expired: not a millisecond
// earlier, and never a key whose publish or fail-safe is under way (closing). A renewal that answers brings the
// deadline forward from when it was sent.
func TestLeaseGivenUpBeforeItLapses(t *testing.T) {
	t.Parallel()
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_800_000_000, 0)
	now := t0
	const lease = 500 * time.Millisecond
	p := &pipeline{k: &keyspace{log: slog.New(slog.DiscardHandler)}, m: m, now: func() time.Time { return now },
		cfg: KeyspaceConfig{Name: "k"}, lease: lease, leaseUntil: t0.Add(lease)}
	held := &item{id: "held", renew: true}
	closing := &item{id: "closing", renew: true, closing: true}
	items := []*item{held, closing}

	check := func(at time.Duration, wantLost bool) {
		t.Helper()
		now = t0.Add(at)
		p.mu.Lock()
		p.foldLeasesLocked(items)
		p.mu.Unlock()
		if held.lost != wantLost {
			t.Errorf("at %v (lease until %v): lost = %v, want %v", at, p.leaseUntil.Sub(t0), held.lost, wantLost)
		}
		if closing.lost || closing.leaseLost {
			t.Errorf("at %v: a closing key was given up", at)
		}
	}
	check(lease*3/4-time.Millisecond, false)
	// A renewal sent at 300 ms answers: the lease runs until 800 ms, given up at 675 ms.
	p.renewed(items, t0.Add(300*time.Millisecond), []*item{held, closing}, []bool{true, false}, nil)
	if closing.renew {
		t.Error("a closing key whose lock is gone (our own publish deleted it) is still renewed")
	}
	check(674*time.Millisecond, false)
	check(675*time.Millisecond, true)
	if got := testutil.ToFloat64(m.leaseExtends.WithLabelValues("k", "lost")); got != 1 {
		t.Errorf("lease_extensions_total{result=lost} = %v, want 1 (the held key; the closing one is not lost)", got)
	}
}
