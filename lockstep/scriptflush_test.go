package lockstep_test

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/redis/go-redis/v9"
)

// noScripts counts NOSCRIPT replies and SCRIPT LOAD calls seen by a client.
type noScripts struct{ noscript, loads atomic.Int64 }

func (h *noScripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *noScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") { // cmd.Err() is not set yet inside the hook
			h.noscript.Add(1)
		}
		h.see([]redis.Cmder{cmd})
		return err
	}
}
func (h *noScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.see(cmds)
		return err
	}
}
func (h *noScripts) see(cmds []redis.Cmder) {
	for _, c := range cmds {
		if c.Err() != nil && strings.HasPrefix(c.Err().Error(), "NOSCRIPT") {
			h.noscript.Add(1)
		}
		if args := c.Args(); len(args) > 1 && c.Name() == "script" && strings.EqualFold(args[1].(string), "load") {
			h.loads.Add(1)
		}
	}
}

// flush empties the server's script cache and resets the counters.
func (h *noScripts) flush(tb testing.TB, rdb redis.UniversalClient) {
	tb.Helper()
	if err := rdb.ScriptFlush(context.Background()).Err(); err != nil {
		tb.Fatalf("SCRIPT FLUSH: %v", err)
	}
	h.noscript.Store(0)
	h.loads.Store(0)
}

func (h *noScripts) check(tb testing.TB, what string, wantLoad bool) {
	tb.Helper()
	if h.noscript.Load() == 0 {
		tb.Errorf("%s: saw no NOSCRIPT reply after SCRIPT FLUSH; the recovery path did not run", what)
	}
	if wantLoad && h.loads.Load() == 0 {
		tb.Errorf("%s: no SCRIPT LOAD after NOSCRIPT in a pipeline", what)
	}
}

// TestAfterScriptFlush: every script call, single (EVALSHA, then EVAL) and pipelined (EVALSHA, SCRIPT LOAD, retry),
// keeps working after SCRIPT FLUSH empties the server's script cache. It runs on a private redis-server: on the
// shared one, other packages' tests reload the scripts between the flush and the call (and would see the flush).
func TestAfterScriptFlush(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.PrivateRedis(t)
	h := &noScripts{}
	rdb.AddHook(h)
	keys := mustKeys(t, testenv.Prefix(t, rdb), true)
	ks := mustFor(t, keys, "f")

	t.Run("single", func(t *testing.T) {
		tok := acquire(t, rdb, ks, time.Minute)
		h.flush(t, rdb)
		if ok, err := lockstep.Extend(ctx, rdb, ks.Lock, tok, time.Hour); err != nil || !ok {
			t.Fatalf("Extend after SCRIPT FLUSH = %v, %v", ok, err)
		}
		h.check(t, "Extend", false)

		h.flush(t, rdb)
		if err := lockstep.Publish(ctx, rdb, lockstep.Write{Keys: ks, Token: tok, Value: []byte("v"), TTL: time.Minute, StaleTTL: time.Hour}); err != nil {
			t.Fatalf("Publish after SCRIPT FLUSH: %v", err)
		}
		h.check(t, "Publish", false)
		if got := rdb.Get(ctx, ks.Cache).Val(); got != "v" {
			t.Errorf("cache = %q, want v", got)
		}

		tok = acquire(t, rdb, ks, time.Minute)
		h.flush(t, rdb)
		if ok, err := lockstep.Release(ctx, rdb, ks.Lock, tok); err != nil || !ok {
			t.Fatalf("Release after SCRIPT FLUSH = %v, %v", ok, err)
		}
		h.check(t, "Release", false)
	})

	t.Run("pipelined", func(t *testing.T) {
		ids := []string{"p1", "p2", "p3"}
		var sets []lockstep.KeySet
		var locks []string
		for _, id := range ids {
			sets = append(sets, mustFor(t, keys, id))
			locks = append(locks, sets[len(sets)-1].Lock)
		}
		tok := lockstep.NewToken()
		if got, err := lockstep.AcquireMany(ctx, rdb, locks, tok, time.Minute); err != nil || !slices.Equal(got, []bool{true, true, true}) {
			t.Fatalf("AcquireMany = %v, %v", got, err)
		}

		h.flush(t, rdb)
		if got, err := lockstep.ExtendMany(ctx, rdb, locks, tok, time.Hour); err != nil || !slices.Equal(got, []bool{true, true, true}) {
			t.Fatalf("ExtendMany after SCRIPT FLUSH = %v, %v", got, err)
		}
		h.check(t, "ExtendMany", true)

		h.flush(t, rdb)
		var ws []lockstep.Write
		for _, s := range sets {
			ws = append(ws, lockstep.Write{Keys: s, Token: tok, Value: []byte("v-" + s.ID), TTL: time.Minute})
		}
		errs, err := lockstep.PublishMany(ctx, rdb, ws)
		if err != nil {
			t.Fatalf("PublishMany after SCRIPT FLUSH: %v", err)
		}
		for i, e := range errs {
			if e.Err != nil {
				t.Errorf("PublishMany result[%d] = %v, want nil", i, e.Err)
			}
		}
		h.check(t, "PublishMany", true)
		for _, s := range sets {
			if got := rdb.Get(ctx, s.Cache).Val(); got != "v-"+s.ID {
				t.Errorf("%s = %q, want v-%s", s.Cache, got, s.ID)
			}
		}

		if _, err := lockstep.AcquireMany(ctx, rdb, locks, tok, time.Minute); err != nil {
			t.Fatal(err)
		}
		h.flush(t, rdb)
		exts, err := lockstep.ExtendValueMany(ctx, rdb, sets, tok, time.Hour, time.Hour)
		if err != nil {
			t.Fatalf("ExtendValueMany after SCRIPT FLUSH: %v", err)
		}
		for i, e := range exts {
			if e.Err != nil {
				t.Errorf("ExtendValueMany result[%d] = %v, want nil", i, e.Err)
			}
		}
		h.check(t, "ExtendValueMany", true)

		if _, err := lockstep.AcquireMany(ctx, rdb, locks, tok, time.Minute); err != nil {
			t.Fatal(err)
		}
		h.flush(t, rdb)
		if err := lockstep.ReleaseMany(ctx, rdb, locks, tok); err != nil {
			t.Fatalf("ReleaseMany after SCRIPT FLUSH: %v", err)
		}
		h.check(t, "ReleaseMany", true)
		if n := rdb.Exists(ctx, locks...).Val(); n != 0 {
			t.Errorf("%d locks survive ReleaseMany, want 0", n)
		}
	})

	t.Run("client", func(t *testing.T) {
		c := newClient(t, rdb, "product", keys, func(_ context.Context, id string) ([]byte, error) { return []byte("c-" + id), nil }, time.Minute)
		h.flush(t, rdb)
		if v, err := c.Get(ctx, "c1"); err != nil || string(v) != "c-c1" {
			t.Fatalf("Get after SCRIPT FLUSH = %q, %v", v, err)
		}
		h.check(t, "Client.Get", false)
		if got := rdb.Get(ctx, mustFor(t, keys, "c1").Cache).Val(); got != "c-c1" {
			t.Errorf("cache = %q, want c-c1 (published)", got)
		}
	})
}
