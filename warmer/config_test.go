package warmer_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/warmer"
)

// TestResolveDefaults checks the one definition of each derived default.
func TestResolveDefaults(t *testing.T) {
	t.Parallel()
	stale, err := lockstep.NewKeys("t:${id}", "", "stale:t:${id}", "")
	if err != nil {
		t.Fatal(err)
	}
	plain, err := lockstep.NewKeys("p:${id}", "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		in   warmer.KeyspaceConfig
		want func(c warmer.KeyspaceConfig) string // "" when right
	}{
		{"lock ttl at least 10s", warmer.KeyspaceConfig{Name: "a", Keys: plain, TTL: time.Minute, StatementTimeout: 2 * time.Second},
			func(c warmer.KeyspaceConfig) string {
				return check(c.LockTTL == 10*time.Second, "lock_ttl %v, want 10s", c.LockTTL)
			}},
		{"lock ttl twice the statement timeout", warmer.KeyspaceConfig{Name: "a", Keys: plain, TTL: time.Minute, StatementTimeout: 8 * time.Second},
			func(c warmer.KeyspaceConfig) string {
				return check(c.LockTTL == 16*time.Second, "lock_ttl %v, want 16s", c.LockTTL)
			}},
		{"stale ttl 10 x ttl with a stale template", warmer.KeyspaceConfig{Name: "a", Keys: stale, TTL: 30 * time.Second},
			func(c warmer.KeyspaceConfig) string {
				return check(c.StaleTTL == 300*time.Second, "stale_ttl %v, want 300s", c.StaleTTL)
			}},
		{"no stale ttl without a template", warmer.KeyspaceConfig{Name: "a", Keys: plain, TTL: 30 * time.Second},
			func(c warmer.KeyspaceConfig) string {
				return check(c.StaleTTL == 0, "stale_ttl %v, want 0", c.StaleTTL)
			}},
		{"max tracked", warmer.KeyspaceConfig{Name: "a", Keys: plain, TTL: time.Minute, TopN: 5000},
			func(c warmer.KeyspaceConfig) string {
				return check(c.MaxTracked == 50000, "max_tracked %d, want 50000", c.MaxTracked)
			}},
		{"max tracked floor", warmer.KeyspaceConfig{Name: "a", Keys: plain, TTL: time.Minute, TopN: 50},
			func(c warmer.KeyspaceConfig) string {
				return check(c.MaxTracked == warmer.DefaultMaxTracked, "max_tracked %d, want %d", c.MaxTracked, warmer.DefaultMaxTracked)
			}},
		{"refresh ahead 20%", warmer.KeyspaceConfig{Name: "a", Keys: plain, TTL: 10 * time.Second},
			func(c warmer.KeyspaceConfig) string {
				return check(c.RefreshAhead == 2*time.Second && c.RefreshAheadFraction == warmer.DefaultRefreshAheadFraction,
					"refresh_ahead %v (fraction %g), want 2s (0.2)", c.RefreshAhead, c.RefreshAheadFraction)
			}},
		{"refresh ahead as a fraction", warmer.KeyspaceConfig{Name: "a", Keys: plain, TTL: 10 * time.Second, RefreshAheadFraction: 0.25},
			func(c warmer.KeyspaceConfig) string {
				return check(c.RefreshAhead == 2500*time.Millisecond, "refresh_ahead %v, want 2.5s", c.RefreshAhead)
			}},
		{"refresh ahead duration wins over a fraction", warmer.KeyspaceConfig{Name: "a", Keys: plain, TTL: 10 * time.Second,
			RefreshAhead: time.Second, RefreshAheadFraction: 0.25},
			func(c warmer.KeyspaceConfig) string {
				return check(c.RefreshAhead == time.Second, "refresh_ahead %v, want 1s", c.RefreshAhead)
			}},
		// statement_timeout -> lock_ttl, one direction: a set lock_ttl leaves statement_timeout at its own default.
		{"statement timeout and lock ttl unset", warmer.KeyspaceConfig{Name: "a", Keys: plain, TTL: time.Minute},
			func(c warmer.KeyspaceConfig) string {
				return check(c.StatementTimeout == warmer.DefaultStatementTimeout && c.LockTTL == warmer.DefaultMinLockTTL,
					"statement_timeout %v, lock_ttl %v; want %v, %v", c.StatementTimeout, c.LockTTL,
					warmer.DefaultStatementTimeout, warmer.DefaultMinLockTTL)
			}},
		{"statement timeout does not derive from lock ttl", warmer.KeyspaceConfig{Name: "a", Keys: plain, TTL: time.Minute, LockTTL: 30 * time.Second},
			func(c warmer.KeyspaceConfig) string {
				return check(c.StatementTimeout == warmer.DefaultStatementTimeout, "statement_timeout %v, want %v",
					c.StatementTimeout, warmer.DefaultStatementTimeout)
			}},
		{"missing defaults to delete", warmer.KeyspaceConfig{Name: "a", Keys: plain, TTL: time.Minute},
			func(c warmer.KeyspaceConfig) string {
				return check(c.Missing == warmer.MissingDelete, "missing %q, want %q", c.Missing, warmer.MissingDelete)
			}},
		{"max tracked raised for the pinned ids", warmer.KeyspaceConfig{Name: "a", Keys: plain, TTL: time.Minute, TopN: 10,
			MaxTracked: 12, Pinned: []string{"1", "2", "3"}},
			func(c warmer.KeyspaceConfig) string {
				return check(c.MaxTracked == 13, "max_tracked %d, want 13 (top_n 10 + 3 pinned)", c.MaxTracked)
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.in.Resolve()
			if err != nil {
				t.Fatal(err)
			}
			if msg := tt.want(got); msg != "" {
				t.Error(msg)
			}
		})
	}
}

func check(ok bool, format string, args ...any) string {
	if ok {
		return ""
	}
	return fmt.Sprintf(format, args...)
}

// TestResolveBounds: every duration has an upper bound, and derived values never overflow into a negative
// TTL (10 × 876000h did).
func TestResolveBounds(t *testing.T) {
	t.Parallel()
	stale, err := lockstep.NewKeys("t:${id}", "", "stale:t:${id}", "")
	if err != nil {
		t.Fatal(err)
	}
	base := func() warmer.KeyspaceConfig {
		return warmer.KeyspaceConfig{Name: "a", Keys: stale, TTL: time.Minute}
	}
	tests := []struct {
		name string
		edit func(c *warmer.KeyspaceConfig)
		want string
	}{
		{"ttl", func(c *warmer.KeyspaceConfig) { c.TTL = 876000 * time.Hour }, `keyspace "a": ttl: 876000h0m0s is above the limit of 8784h0m0s`},
		{"statement timeout", func(c *warmer.KeyspaceConfig) { c.StatementTimeout = 1500000 * time.Hour }, `keyspace "a": statement_timeout: 1500000h0m0s is above the limit`},
		{"lock ttl", func(c *warmer.KeyspaceConfig) { c.LockTTL = 9000 * time.Hour }, `keyspace "a": lock_ttl: 9000h0m0s is above the limit`},
		{"max stale", func(c *warmer.KeyspaceConfig) { c.MaxStale = 9000 * time.Hour }, `keyspace "a": max_stale: 9000h0m0s is above the limit`},
		{"stale ttl", func(c *warmer.KeyspaceConfig) { c.StaleTTL = 9000 * time.Hour }, `keyspace "a": stale_ttl: 9000h0m0s is above the limit`},
		{"stale ttl below ttl", func(c *warmer.KeyspaceConfig) { c.StaleTTL = time.Second }, `keyspace "a": stale_ttl: 1s must be longer than ttl`},
		{"jitter", func(c *warmer.KeyspaceConfig) { c.Jitter = 2 }, `keyspace "a": jitter: 2 is outside [0,1]`},
		{"top_n", func(c *warmer.KeyspaceConfig) { c.TopN = warmer.MaxTopN + 1 }, `keyspace "a": top_n: 1000001 is not in [0, 1000000]`},
		// One owner of max_tracked ≥ top_n: an error here (it was silently raised), as in the config file.
		{"max_tracked below top_n", func(c *warmer.KeyspaceConfig) { c.TopN, c.MaxTracked = 100, 50 }, `keyspace "a": max_tracked: 50 must be at least top_n (100)`},
		// The sketch is allocated for max_tracked at start, and ages in whole seconds.
		{"max_tracked above the limit", func(c *warmer.KeyspaceConfig) { c.MaxTracked = warmer.MaxTrackedLimit + 1 }, `keyspace "a": max_tracked: 10000001 is above the limit of 10000000`},
		{"history below decay", func(c *warmer.KeyspaceConfig) { c.DecayHalfLife, c.HistoryHalfLife = time.Hour, time.Minute }, `keyspace "a": history_half_life: 1m0s is below decay_half_life (1h0m0s)`},
		{"history below 1s", func(c *warmer.KeyspaceConfig) {
			c.DecayHalfLife, c.HistoryHalfLife = 100*time.Millisecond, 900*time.Millisecond
		}, `keyspace "a": history_half_life: 900ms is below 1s`},
		{"refresh_ahead fraction", func(c *warmer.KeyspaceConfig) { c.RefreshAheadFraction = 1 }, `keyspace "a": refresh_ahead: 1 is not a fraction of the ttl in (0, 1)`},
		{"missing", func(c *warmer.KeyspaceConfig) { c.Missing = "drop" }, `keyspace "a": missing: "drop" is not a policy: want "delete", "keep" or "tombstone"`},
		// The derived 10 × ttl is bounded like a set one, so that validate and run agree.
		{"derived stale ttl", func(c *warmer.KeyspaceConfig) { c.TTL = 879 * time.Hour }, `keyspace "a": stale_ttl: the default 10 × ttl (879h0m0s) = 8790h0m0s is above the limit`},
		{"derived lock ttl", func(c *warmer.KeyspaceConfig) {
			c.TTL, c.Keys = warmer.MaxDuration, nostale(t)
			c.StatementTimeout = 4393 * time.Hour
		}, `keyspace "a": lock_ttl: the default 2 × statement_timeout (4393h0m0s) = 8786h0m0s is above the limit`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			tt.edit(&c)
			got, err := c.Resolve()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Resolve: got %v (stale_ttl %v, lock_ttl %v), want an error containing %q", err, got.StaleTTL, got.LockTTL, tt.want)
			}
		})
	}
	// The largest allowed values derive without overflow, and what Resolve returns resolves again unchanged: the
	// effective values validate shows (and run passes to New) are accepted.
	for _, c := range []warmer.KeyspaceConfig{
		{Name: "a", Keys: nostale(t), TTL: warmer.MaxDuration, StatementTimeout: warmer.MaxDuration / 4, Jitter: 1},
		{Name: "a", Keys: stale, TTL: warmer.MaxDuration / warmer.DefaultStaleTTLFactor, Jitter: 1},
	} {
		got, err := c.Resolve()
		if err != nil {
			t.Fatal(err)
		}
		if (got.StaleTTL != 0 && got.StaleTTL <= got.TTL) || got.LockTTL <= got.StatementTimeout {
			t.Errorf("derived stale_ttl %v, lock_ttl %v: want them above ttl and statement_timeout", got.StaleTTL, got.LockTTL)
		}
		again, err := got.Resolve()
		if err != nil {
			t.Fatalf("resolving the resolved config again: %v", err)
		}
		if again.StaleTTL != got.StaleTTL || again.LockTTL != got.LockTTL {
			t.Errorf("resolved twice: stale_ttl %v, lock_ttl %v; once: %v, %v", again.StaleTTL, again.LockTTL, got.StaleTTL, got.LockTTL)
		}
	}
}

func nostale(t *testing.T) *lockstep.Keys {
	t.Helper()
	k, err := lockstep.NewKeys("t:${id}", "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestHistoryHalfLifeDefault: 6 × decay_half_life, at least 1s (the sketch ages in whole seconds), at most
// MaxDuration (a decay_half_life that is valid stays valid).
func TestHistoryHalfLifeDefault(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ decay, want time.Duration }{
		{0, 6 * warmer.DefaultDecayHalfLife},
		{33 * time.Second, 198 * time.Second},
		{100 * time.Millisecond, time.Second},
		{warmer.MaxDuration, warmer.MaxDuration},
	} {
		c, err := warmer.KeyspaceConfig{Name: "a", Keys: nostale(t), TTL: time.Minute, DecayHalfLife: tc.decay}.Resolve()
		if err != nil {
			t.Fatalf("decay_half_life %v: %v", tc.decay, err)
		}
		if c.HistoryHalfLife != tc.want {
			t.Errorf("decay_half_life %v: history_half_life %v, want %v", tc.decay, c.HistoryHalfLife, tc.want)
		}
	}
}
