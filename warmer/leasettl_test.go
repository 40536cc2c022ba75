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
			if got := cfg.Lease(); got != tt.want {
				t.Errorf("Lease() = %v with lead %v, lock_ttl %v; want %v", got, cfg.Lead(0), cfg.LockTTL, tt.want)
			}
		})
	}
}

// TestLateLeaseKeepsItsKeys: with renewals that do not get through for 3/4 of a lease, the batch counts the
// lateness once per stall (result "late"), not a millisecond earlier, and keeps its keys: its writes are
// token-checked, so a lock that lapsed is never written through, and one that did not still lets the batch
// publish the value it read (giving them up threw good origin reads away on every scheduling stall, and the keys
// expired). Only a renewal that finds a lock gone or taken loses the key, and never a key whose publish or
// fail-safe is under way (closing). A renewal that answers brings the deadline forward from when it was sent.
func TestLateLeaseKeepsItsKeys(t *testing.T) {
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
	taken := &item{id: "taken", renew: true}
	closing := &item{id: "closing", renew: true, closing: true}
	items := []*item{held, taken, closing}
	late := func() float64 { return testutil.ToFloat64(m.leaseExtends.WithLabelValues("k", "late")) }

	fold := func(at time.Duration) {
		t.Helper()
		now = t0.Add(at)
		p.mu.Lock()
		p.foldLeasesLocked(items)
		p.mu.Unlock()
		if held.lost || !held.renew {
			t.Errorf("at %v (lease until %v): held key lost = %v, renewed = %v; want kept and renewed", at,
				p.leaseUntil.Sub(t0), held.lost, held.renew)
		}
		if closing.lost || closing.leaseLost {
			t.Errorf("at %v: a closing key was given up", at)
		}
	}
	fold(lease*3/4 - time.Millisecond)
	if got := late(); got != 0 {
		t.Errorf("lease_extensions_total{result=late} = %v before 3/4 of the lease, want 0", got)
	}
	fold(lease * 3 / 4)
	fold(lease) // the same stall: counted once
	if got := late(); got != 2 {
		t.Errorf("lease_extensions_total{result=late} = %v after one stall, want 2 (each renewed key once; not the closing one)", got)
	}
	// A renewal sent at 300 ms answers: held is still ours, taken is another token's, closing's lock was deleted
	// by our own publish. The lease runs until 800 ms; late again from 675 ms.
	p.renewed(items, t0.Add(300*time.Millisecond), []*item{held, taken, closing}, []bool{true, false, false}, nil)
	if closing.renew {
		t.Error("a closing key whose lock is gone (our own publish deleted it) is still renewed")
	}
	fold(674 * time.Millisecond)
	if !taken.lost {
		t.Error("a key whose renewal found its lock taken is not lost")
	}
	if got := testutil.ToFloat64(m.leaseExtends.WithLabelValues("k", "lost")); got != 1 {
		t.Errorf("lease_extensions_total{result=lost} = %v, want 1 (the taken key; the closing one is not lost)", got)
	}
	if got := late(); got != 2 {
		t.Errorf("lease_extensions_total{result=late} = %v within the renewed lease, want still 2", got)
	}
	fold(675 * time.Millisecond) // a second stall: held only (taken is lost, closing is closing)
	if got := late(); got != 3 {
		t.Errorf("lease_extensions_total{result=late} = %v after a second stall, want 3", got)
	}
}

// TestRenewalThatKeptNoLockProvesNoLease: a renewal that Redis ran after every lock of the batch had lapsed (sent
// just before a paused Redis resumed) finds them all gone. It must not move the lease's deadline: a publish whose
// lock was found gone before that deadline is taken for an invalidation, an exclusion from the SLO, where this
// was a lapse whose key had expired in the pause (seed 7201: five gaps of 5–8 s counted by nobody). A renewal
// that kept one lock does move it: the batch's locks share one lease.
func TestRenewalThatKeptNoLockProvesNoLease(t *testing.T) {
	t.Parallel()
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_800_000_000, 0)
	const lease = 500 * time.Millisecond
	now := t0.Add(10 * time.Second)
	p := &pipeline{k: &keyspace{log: slog.New(slog.DiscardHandler)}, m: m, now: func() time.Time { return now },
		cfg: KeyspaceConfig{Name: "k"}, lease: lease, leaseUntil: t0.Add(lease)}
	a := &item{id: "a", renew: true, closing: true} // its publish is in flight
	b := &item{id: "b", renew: true, closing: true}
	items := []*item{a, b}
	p.renewed(items, t0.Add(9*time.Second), items, []bool{false, false}, nil)
	if got := p.leaseUntil.Sub(t0); got != lease {
		t.Errorf("after a renewal that kept no lock, the lease runs until %v; want still %v", got, lease)
	}
	if a.goneInLease || b.goneInLease {
		t.Error("locks found gone by a renewal answered after the deadline are marked gone within the lease")
	}
	// Sent before the deadline and answered before it: the lock vanished while the lease held (an invalidation);
	// the deadline moves on from the send.
	now = t0.Add(300 * time.Millisecond)
	d := &item{id: "d", renew: true, closing: true}
	p.renewed([]*item{d}, t0.Add(200*time.Millisecond), []*item{d}, []bool{false}, nil)
	if !d.goneInLease {
		t.Error("a lock found gone by a renewal answered within the lease is not marked gone within it")
	}
	if got, want := p.leaseUntil.Sub(t0), 200*time.Millisecond+lease; got != want {
		t.Errorf("after a renewal sent before the deadline, the lease runs until %v; want %v", got, want)
	}
	c := &item{id: "c", renew: true}
	p.renewed([]*item{c, a}, t0.Add(9*time.Second), []*item{c, a}, []bool{true, false}, nil)
	if got, want := p.leaseUntil.Sub(t0), 9*time.Second+lease; got != want {
		t.Errorf("after a renewal that kept a lock, the lease runs until %v; want %v", got, want)
	}
}
