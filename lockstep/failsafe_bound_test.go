package lockstep_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
)

// TestExtendValueBoundExact: two processes (two clients, a fresh token each round) extend the same values with
// ExtendValueMany as fast as they can, over and over, for the whole max_stale. Read from outside after every
// round, to the millisecond: stale_since_ms is each value's original expiry (its PEXPIRETIME before the first
// extension), the cache key never expires later than stale_since_ms + max_stale, the meta hash expires at the
// same instant as the cache key, and in the end every value expires exactly at the bound. extend_value.lua v2
// read PTTL, then TIME, then set a relative PEXPIRE on each key in turn, so a millisecond that passed between
// those commands (a pause of the server, at worst) moved the start of staleness and the expiry past the bound.
func TestExtendValueBoundExact(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	procs := []*redis.Client{testenv.Redis(t), testenv.Redis(t)}
	obs := testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, obs), false)
	const (
		n        = 100
		life     = 300 * time.Millisecond
		want     = 400 * time.Millisecond
		maxStale = time.Second
	)
	kss := make([]lockstep.KeySet, n)
	locks := make([]string, n)
	for i := range kss {
		kss[i] = mustFor(t, keys, fmt.Sprint(i))
		locks[i] = kss[i].Lock
	}
	if _, err := obs.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, ks := range kss {
			p.Set(ctx, ks.Cache, "v", life)
		}
		return nil
	}); err != nil {
		t.Fatalf("write values: %v", err)
	}
	expiry := expireTimes(t, obs, kss, func(ks lockstep.KeySet) string { return ks.Cache })
	bound := make([]int64, n)
	for i, e := range expiry {
		if e <= 0 {
			t.Fatalf("PEXPIRETIME %s = %d before any extension", kss[i].Cache, e)
		}
		bound[i] = e + maxStale.Milliseconds()
	}
	// Stop while the values are still alive, after the last want before the bound has begun.
	stop := time.Now().Add(life + maxStale - 150*time.Millisecond)
	var rounds, extended, limited int
	for round := 0; time.Now().Before(stop); round++ {
		rdb := procs[round%2]
		token := lockstep.NewToken()
		held, err := lockstep.AcquireMany(ctx, rdb, locks, token, time.Minute)
		if err != nil {
			t.Fatalf("round %d: AcquireMany: %v", round, err)
		}
		var mine []lockstep.KeySet
		for i, h := range held {
			if !h {
				t.Fatalf("round %d: lock %s held elsewhere; the fail-safe releases every lock", round, locks[i])
			}
			mine = append(mine, kss[i])
		}
		res, err := lockstep.ExtendValueMany(ctx, rdb, mine, token, want, maxStale)
		if err != nil {
			t.Fatalf("round %d: ExtendValueMany: %v", round, err)
		}
		for i, r := range res {
			switch {
			case r.Err == nil && (r.TTL <= 0 || r.TTL > want):
				t.Fatalf("round %d: %s extended to %v, want in (0, %v]", round, kss[i].Cache, r.TTL, want)
			case r.Err == nil:
				extended++
			case errors.Is(r.Err, lockstep.ErrStaleLimit):
				limited++
			default:
				t.Fatalf("round %d: %s: %v, want extended or ErrStaleLimit (the value is alive)", round, kss[i].Cache, r.Err)
			}
		}
		rounds++
		cacheAt := expireTimes(t, obs, kss, func(ks lockstep.KeySet) string { return ks.Cache })
		metaAt := expireTimes(t, obs, kss, func(ks lockstep.KeySet) string { return ks.Meta })
		since := staleSince(t, obs, kss)
		for i := range kss {
			switch {
			case since[i] != expiry[i]:
				t.Fatalf("round %d: %s stale_since_ms = %d, want %d (the value's expiry before the first extension)",
					round, kss[i].Meta, since[i], expiry[i])
			case cacheAt[i] > bound[i]:
				t.Fatalf("round %d: %s PEXPIRETIME = %d, %d ms past stale_since_ms + max_stale = %d", round,
					kss[i].Cache, cacheAt[i], cacheAt[i]-bound[i], bound[i])
			case metaAt[i] != cacheAt[i]:
				t.Fatalf("round %d: %s PEXPIRETIME = %d, want the cache key's %d", round, kss[i].Meta, metaAt[i], cacheAt[i])
			}
		}
	}
	final := expireTimes(t, obs, kss, func(ks lockstep.KeySet) string { return ks.Cache })
	for i := range kss {
		if final[i] != bound[i] {
			t.Errorf("%s: final PEXPIRETIME = %d, want exactly stale_since_ms + max_stale = %d", kss[i].Cache, final[i], bound[i])
		}
	}
	t.Logf("%d rounds over %d values: %d extensions, %d at the stale limit", rounds, n, extended, limited)
}

// expireTimes reads PEXPIRETIME (Unix ms; -2 gone, -1 no TTL) of key(ks) for every ks, in one pipeline.
func expireTimes(t *testing.T, c *redis.Client, kss []lockstep.KeySet, key func(lockstep.KeySet) string) []int64 {
	t.Helper()
	ctx := context.Background()
	cmds := make([]*redis.Cmd, len(kss))
	if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, ks := range kss {
			cmds[i] = p.Do(ctx, "pexpiretime", key(ks))
		}
		return nil
	}); err != nil {
		t.Fatalf("PEXPIRETIME: %v", err)
	}
	out := make([]int64, len(kss))
	for i, cmd := range cmds {
		out[i], _ = cmd.Int64()
	}
	return out
}

// staleSince reads every meta hash's stale_since_ms (0 when absent), in one pipeline.
func staleSince(t *testing.T, c *redis.Client, kss []lockstep.KeySet) []int64 {
	t.Helper()
	ctx := context.Background()
	cmds := make([]*redis.StringCmd, len(kss))
	if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, ks := range kss {
			cmds[i] = p.HGet(ctx, ks.Meta, lockstep.MetaStaleSinceField)
		}
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		t.Fatalf("HGET %s: %v", lockstep.MetaStaleSinceField, err)
	}
	out := make([]int64, len(kss))
	for i, cmd := range cmds {
		out[i], _ = cmd.Int64()
	}
	return out
}
