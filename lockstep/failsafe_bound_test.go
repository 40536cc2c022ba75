package lockstep_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
// same instant as the cache key, and every value is seen, by a read before the bound, to expire exactly at it (the
// last extension clips to the bound; it does not stop short). A read at or after the bound judges nothing: on a
// loaded machine the rounds can run past it, and the values are then gone as they should be (CI once read -2 for
// every key in a final read that came after the bound). extend_value.lua v2
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
		life     = 500 * time.Millisecond
		want     = time.Second // a round in the last want before the bound clips to it
		maxStale = 3 * time.Second
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
	// Stop once every value was seen at its bound, or at the bound: later reads find the values gone.
	stop := time.Now().Add(life + maxStale)
	atBound := make([]bool, n) // seen expiring exactly at stale_since_ms + max_stale by a read before it
	seenAll := func() bool {
		for _, b := range atBound {
			if !b {
				return false
			}
		}
		return true
	}
	var rounds, extended, limited int
	for round := 0; time.Now().Before(stop) && !seenAll(); round++ {
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
		// On a loaded machine a round can end past the bound, where the values have expired as they should:
		// judge only what was read before it.
		tm, err := obs.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		for i := range kss {
			if tm.UnixMilli() >= bound[i] {
				continue
			}
			switch {
			case since[i] != expiry[i]:
				t.Fatalf("round %d: %s stale_since_ms = %d, want %d (the value's expiry before the first extension)",
					round, kss[i].Meta, since[i], expiry[i])
			case cacheAt[i] > bound[i]:
				t.Fatalf("round %d: %s PEXPIRETIME = %d, %d ms past stale_since_ms + max_stale = %d", round,
					kss[i].Cache, cacheAt[i], cacheAt[i]-bound[i], bound[i])
			case metaAt[i] != cacheAt[i]:
				t.Fatalf("round %d: %s PEXPIRETIME = %d, want the cache key's %d", round, kss[i].Meta, metaAt[i], cacheAt[i])
			case cacheAt[i] == bound[i]:
				atBound[i] = true
			}
		}
	}
	for i := range kss {
		if !atBound[i] {
			t.Errorf("%s: never seen expiring exactly at stale_since_ms + max_stale = %d before it", kss[i].Cache, bound[i])
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

// TestExtendValueWithoutPexpiretime: where PEXPIRETIME is not available (Redis < 7.0, or an ACL without it),
// extend_value.lua's pcall fails and it takes the value's expiry from TIME + PTTL: the start of staleness is then
// the expiry to within a millisecond, and the bound still holds exactly from it (PEXPIREAT). A private Redis with
// an ACL user denied PEXPIRETIME stands in for the old server.
func TestExtendValueWithoutPexpiretime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := testenv.PrivateRedis(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", "old", "on", ">pw", "~*", "+@all", "-pexpiretime").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: admin.Options().Addr, Username: "old", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Do(ctx, "pexpiretime", "x").Err(); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
		t.Fatalf("PEXPIRETIME as the restricted user: %v, want NOPERM", err)
	}
	admin.Do(ctx, "ACL", "LOG", "RESET") // forget the probe's denial
	ks := mustFor(t, mustKeys(t, "old:", false), "1")
	const maxStale = time.Second
	admin.Set(ctx, ks.Cache, "v", 300*time.Millisecond)
	expiry := expireTimes(t, admin, []lockstep.KeySet{ks}, func(ks lockstep.KeySet) string { return ks.Cache })[0]
	for i := range 3 {
		token := lockstep.NewToken()
		if ok, err := lockstep.Acquire(ctx, rdb, ks.Lock, token, time.Minute); !ok || err != nil {
			t.Fatalf("Acquire = %v, %v", ok, err)
		}
		res, err := lockstep.ExtendValueMany(ctx, rdb, []lockstep.KeySet{ks}, token, 10*time.Second, maxStale)
		if err != nil || (res[0].Err != nil && !errors.Is(res[0].Err, lockstep.ErrStaleLimit)) {
			t.Fatalf("extension %d: %+v, %v", i, res, err)
		}
	}
	since := staleSince(t, admin, []lockstep.KeySet{ks})[0]
	// Without PEXPIRETIME the script reads TIME (µs, truncated to ms) + PTTL (ms): each rounding can move the sum
	// by 1 ms either way (a make test run saw expiry − 1).
	if d := since - expiry; d < -1 || d > 1 {
		t.Errorf("stale_since_ms = %d, want the value's expiry %d (±1 ms: TIME + PTTL)", since, expiry)
	}
	at := expireTimes(t, admin, []lockstep.KeySet{ks}, func(ks lockstep.KeySet) string { return ks.Cache })[0]
	if at != since+maxStale.Milliseconds() {
		t.Errorf("PEXPIRETIME = %d, want exactly stale_since_ms + max_stale = %d", at, since+maxStale.Milliseconds())
	}
	if denials, err := admin.Do(ctx, "ACL", "LOG").Slice(); err != nil || len(denials) == 0 {
		t.Errorf("ACL LOG = %v, %v: the script's PEXPIRETIME was not denied, so the fallback did not run", denials, err)
	}
}
