package warmer

import (
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/lockstep"
)

// TestLease: the daemon's lock lease is a quarter of the keyspace's smallest lead, at least minLease and at most
// lock_ttl.
func TestLease(t *testing.T) {
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
