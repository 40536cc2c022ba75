package lockstep_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/redis/go-redis/v9"
)

// TestGetStampede: 500 concurrent readers in 3 processes (3 connection pools, 3 Clients) read a missing key; the
// loader runs exactly once and every reader gets the value. 20 rounds, each on a fresh key.
func TestGetStampede(t *testing.T) {
	t.Parallel()
	const procs, readers, rounds = 3, 500, 20
	ctx := context.Background()
	var loads atomic.Int64
	load := func(ctx context.Context, id string) ([]byte, error) {
		loads.Add(1)
		time.Sleep(50 * time.Millisecond)
		return []byte("value of " + id), nil
	}
	var clients [procs]*lockstep.Client
	var prefix string
	var keys *lockstep.Keys
	for i := range clients {
		rdb := testenv.Redis(t)
		if i == 0 {
			prefix = testenv.Prefix(t, rdb)
			keys = mustKeys(t, prefix, false)
		}
		// 500 readers share 3 pools: on a busy machine a reader may queue for a connection longer than the
		// default 1 s Redis bound, which is not what this test is about (the bound has its own tests).
		clients[i] = newClient(t, rdb, "product", keys, load, time.Minute, lockstep.WithRedisTimeout(30*time.Second))
	}
	for round := range rounds {
		id := "stampede-" + strconv.Itoa(round)
		loads.Store(0)
		start := make(chan struct{})
		var wg sync.WaitGroup
		var bad atomic.Int64
		var firstErr atomic.Value
		for g := range readers {
			wg.Go(func() {
				<-start
				v, err := clients[g%procs].Get(ctx, id)
				if err != nil || string(v) != "value of "+id {
					bad.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("Get = %q, %v", v, err))
				}
			})
		}
		close(start)
		wg.Wait()
		if n := loads.Load(); n != 1 {
			t.Errorf("round %d: loader ran %d times, want 1", round, n)
		}
		if n := bad.Load(); n != 0 {
			t.Fatalf("round %d: %d of %d readers did not get the value; first: %v", round, n, readers, firstErr.Load())
		}
	}
}

func TestGetMissThenHit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, rdb), true)
	var loads atomic.Int64
	load := func(ctx context.Context, id string) ([]byte, error) {
		loads.Add(1)
		time.Sleep(20 * time.Millisecond)
		return []byte("v" + id), nil
	}
	rec := newCountingRecorder()
	c := newClient(t, rdb, "product", keys, load, time.Minute, lockstep.WithRecorder(rec), lockstep.WithStale(time.Hour), lockstep.WithJitter(0.5),
		lockstep.WithMeta(true))
	for i, want := range []string{"v9", "v9"} {
		v, err := c.Get(ctx, "9")
		if err != nil || string(v) != want {
			t.Fatalf("Get #%d = %q, %v; want %q", i, v, err, want)
		}
	}
	if n := loads.Load(); n != 1 {
		t.Errorf("loader ran %d times, want 1", n)
	}
	if h, m := rec.hits.Load(), rec.misses.Load(); h != 1 || m != 1 {
		t.Errorf("hits, misses = %d, %d; want 1, 1", h, m)
	}
	if n := rec.rebuildCount(lockstep.ResultOK); n != 1 {
		t.Errorf("rebuilds ok = %d, want 1", n)
	}
	ks := mustFor(t, keys, "9")
	if pttl := rdb.PTTL(ctx, ks.Cache).Val(); pttl < 59*time.Second || pttl >= 90*time.Second {
		t.Errorf("cache PTTL = %v, want in [1m, 1m30s) (ttl 1m, jitter 0.5)", pttl)
	}
	if got := rdb.Get(ctx, ks.Stale).Val(); got != "v9" {
		t.Errorf("stale copy = %q, want v9", got)
	}
	if d, _ := strconv.Atoi(rdb.HGet(ctx, ks.Meta, lockstep.MetaDeltaField).Val()); d < 20 || d > 2000 {
		t.Errorf("meta δ = %d ms, want the loader's duration (≥ 20ms)", d)
	}
	if rdb.Exists(ctx, ks.Lock).Val() != 0 {
		t.Errorf("lock survives the rebuild")
	}
}

// TestGetLoaderSlowerThanLockTTL: the first leader's loader outlives its lock; a second process takes the lock
// and publishes; the first leader's publish is refused (lock lost) and the second value stays.
func TestGetLoaderSlowerThanLockTTL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdbA, rdbB := testenv.Redis(t), testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, rdbA), false)
	ks := mustFor(t, keys, "slow")
	b := newClient(t, rdbB, "product", keys, func(context.Context, string) ([]byte, error) { return []byte("second"), nil }, time.Minute)
	var fromB []byte
	var errB error
	slow := func(context.Context, string) ([]byte, error) {
		waitGone(t, rdbA, ks.Lock) // the lock (TTL 50ms) expires while this loader still runs
		fromB, errB = b.Get(ctx, "slow")
		return []byte("first"), nil
	}
	rec := newCountingRecorder()
	a := newClient(t, rdbA, "product", keys, slow, time.Minute, lockstep.WithLockTTL(50*time.Millisecond), lockstep.WithRecorder(rec))

	v, err := a.Get(ctx, "slow")
	if err != nil || string(v) != "first" {
		t.Fatalf("slow leader's Get = %q, %v; want its own value and no error", v, err)
	}
	if errB != nil || string(fromB) != "second" {
		t.Fatalf("second leader's Get = %q, %v; want second", fromB, errB)
	}
	if n := rec.rebuildCount(lockstep.ResultLockLost); n != 1 {
		t.Errorf("slow leader's rebuilds with result lock_lost = %d, want 1", n)
	}
	if got := rdbA.Get(ctx, ks.Cache).Val(); got != "second" {
		t.Fatalf("cache = %q, want the second leader's value", got)
	}
}

// TestGetFollowerTimeout: with the lock held by someone else who never publishes, a follower serves the stale
// copy when there is one and ErrRebuildTimeout when not; it never calls the loader.
func TestGetFollowerTimeout(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		staleTpl  bool
		staleVal  string // "" = no stale copy in Redis
		want      string
		wantErr   error
		wantStale int64
	}{
		{name: "stale copy", staleTpl: true, staleVal: "old", want: "old", wantStale: 1},
		{name: "no stale copy", staleTpl: true, wantErr: lockstep.ErrRebuildTimeout},
		{name: "no stale template", staleTpl: false, wantErr: lockstep.ErrRebuildTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			rdb := testenv.Redis(t)
			keys := mustKeys(t, testenv.Prefix(t, rdb), tt.staleTpl)
			ks := mustFor(t, keys, "held")
			rdb.Set(ctx, ks.Lock, "another-process", time.Minute)
			if tt.staleVal != "" {
				rdb.Set(ctx, ks.Stale, tt.staleVal, time.Hour)
			}
			var loads atomic.Int64
			load := func(context.Context, string) ([]byte, error) { loads.Add(1); return []byte("fresh"), nil }
			rec := newCountingRecorder()
			c := newClient(t, rdb, "product", keys, load, time.Minute, lockstep.WithRecorder(rec),
				lockstep.WithWait(lockstep.Backoff{Initial: 20 * time.Millisecond, Max: 50 * time.Millisecond, Total: 250 * time.Millisecond}))
			start := time.Now()
			v, err := c.Get(ctx, "held")
			took := time.Since(start)
			checkGet(t, v, err, tt.want, tt.wantErr)
			if n := loads.Load(); n != 0 {
				t.Errorf("a follower called the loader %d times, want 0", n)
			}
			if n := rec.stale.Load(); n != tt.wantStale {
				t.Errorf("stale serves = %d, want %d", n, tt.wantStale)
			}
			if n := rec.contention.Load(); n != 1 {
				t.Errorf("lock contentions = %d, want 1", n)
			}
			if took < 250*time.Millisecond {
				t.Errorf("Get returned after %v, before the 250ms wait budget", took)
			}
			if got := rdb.Get(ctx, ks.Lock).Val(); got != "another-process" {
				t.Errorf("lock = %q, want the other process's (untouched)", got)
			}
		})
	}
}

// TestGetFollowerPicksUpPublish: a follower returns the value another process publishes while it waits.
func TestGetFollowerPicksUpPublish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, other := testenv.Redis(t), testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, rdb), false)
	ks := mustFor(t, keys, "w")
	tok := acquire(t, other, ks, time.Minute)
	rec := newCountingRecorder()
	rec.onContention = func() { // the other process publishes as soon as this one becomes a follower
		if err := lockstep.Publish(ctx, other, lockstep.Write{Keys: ks, Token: tok, Value: []byte("theirs"), TTL: time.Minute}); err != nil {
			t.Errorf("Publish: %v", err)
		}
	}
	c := newClient(t, rdb, "product", keys, func(context.Context, string) ([]byte, error) {
		t.Error("a follower called the loader")
		return nil, errors.New("unexpected")
	}, time.Minute, lockstep.WithRecorder(rec))
	v, err := c.Get(ctx, "w")
	if err != nil || string(v) != "theirs" {
		t.Fatalf("Get = %q, %v; want theirs", v, err)
	}
	if n := rec.waitCount(lockstep.WaitHit); n != 1 {
		t.Errorf("waits ended by a hit = %d, want 1", n)
	}
}

// TestGetLeaderRecheck: a value published between the first GET and the SET NX is found by the GET pipelined with
// the SET NX; the leader releases the lock and returns it without calling the loader.
func TestGetLeaderRecheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, other := testenv.Redis(t), testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, rdb), false)
	ks := mustFor(t, keys, "r")
	rdb.AddHook(afterFirst{key: ks.Cache, fn: func() { other.Set(ctx, ks.Cache, "raced", time.Minute) }, done: new(atomic.Bool)})
	c := newClient(t, rdb, "product", keys, func(context.Context, string) ([]byte, error) {
		t.Error("loader called although the re-check found a value")
		return nil, errors.New("unexpected")
	}, time.Minute)
	v, err := c.Get(ctx, "r")
	if err != nil || string(v) != "raced" {
		t.Fatalf("Get = %q, %v; want raced", v, err)
	}
	if rdb.Exists(ctx, ks.Lock).Val() != 0 {
		t.Errorf("the leader kept the lock after its re-check hit")
	}
}

// afterFirst runs fn once, right after the first single GET of key.
type afterFirst struct {
	key  string
	fn   func()
	done *atomic.Bool
}

func (h afterFirst) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h afterFirst) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h afterFirst) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if args := cmd.Args(); cmd.Name() == "get" && len(args) == 2 && args[1] == h.key && h.done.CompareAndSwap(false, true) {
			h.fn()
		}
		return err
	}
}

func TestGetNotFoundAndLoaderError(t *testing.T) {
	t.Parallel()
	dbDown := errors.New("db down")
	tests := []struct {
		name       string
		loadErr    error
		wantIs     error
		wantResult string
	}{
		{"not found", fmt.Errorf("product 404: %w", lockstep.ErrNotFound), lockstep.ErrNotFound, lockstep.ResultMissing},
		{"loader error", dbDown, dbDown, lockstep.ResultError},
		{"loader deadline", context.DeadlineExceeded, context.DeadlineExceeded, lockstep.ResultError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			rdb := testenv.Redis(t)
			keys := mustKeys(t, testenv.Prefix(t, rdb), true)
			ks := mustFor(t, keys, "x")
			rec := newCountingRecorder()
			c := newClient(t, rdb, "product", keys, func(context.Context, string) ([]byte, error) { return nil, tt.loadErr }, time.Minute,
				lockstep.WithRecorder(rec), lockstep.WithStale(time.Hour))
			v, err := c.Get(ctx, "x")
			if !errors.Is(err, tt.wantIs) || v != nil {
				t.Fatalf("Get = %q, %v; want an error wrapping %v", v, err, tt.wantIs)
			}
			if !strings.Contains(err.Error(), `"x"`) {
				t.Errorf("error %q does not name the id", err)
			}
			if n := rdb.Exists(ctx, ks.Cache, ks.Meta, ks.Stale, ks.Lock).Val(); n != 0 {
				t.Errorf("%d of cache, meta, stale, lock exist, want 0 (nothing cached, lock released)", n)
			}
			if n := rec.rebuildCount(tt.wantResult); n != 1 {
				t.Errorf("rebuilds with result %s = %d, want 1", tt.wantResult, n)
			}
		})
	}
}

func TestNewBadArguments(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	keys := mustKeys(t, "p:", false)
	load := func(context.Context, string) ([]byte, error) { return nil, nil }
	tests := []struct {
		name  string
		build func() (*lockstep.Client, error)
		want  []string
	}{
		{"nil rdb", func() (*lockstep.Client, error) { return lockstep.New(nil, "p", keys, load, time.Minute) }, []string{"rdb: nil"}},
		{"empty keyspace", func() (*lockstep.Client, error) { return lockstep.New(rdb, "", keys, load, time.Minute) }, []string{"keyspace: empty"}},
		{"nil keys", func() (*lockstep.Client, error) { return lockstep.New(rdb, "p", nil, load, time.Minute) }, []string{"keys: nil"}},
		{"zero keys", func() (*lockstep.Client, error) { return lockstep.New(rdb, "p", &lockstep.Keys{}, load, time.Minute) }, []string{"keys: not made by NewKeys"}},
		{"nil loader", func() (*lockstep.Client, error) { return lockstep.New(rdb, "p", keys, nil, time.Minute) }, []string{"load: nil"}},
		{"zero ttl", func() (*lockstep.Client, error) { return lockstep.New(rdb, "p", keys, load, 0) }, []string{"ttl: 0s is not > 0"}},
		{"negative ttl", func() (*lockstep.Client, error) { return lockstep.New(rdb, "p", keys, load, -time.Second) }, []string{"ttl: -1s is not > 0"}},
		{"several at once", func() (*lockstep.Client, error) { return lockstep.New(nil, "", keys, load, 0) }, []string{"rdb: nil", "keyspace: empty", "ttl:"}},
	}
	opt := func(o lockstep.Option) func() (*lockstep.Client, error) {
		return func() (*lockstep.Client, error) { return lockstep.New(rdb, "p", keys, load, time.Minute, o) }
	}
	for _, o := range []struct {
		name string
		o    lockstep.Option
		want string
	}{
		{"jitter above 1", lockstep.WithJitter(1.5), "jitter: 1.5 is outside [0, 1]"},
		{"jitter negative", lockstep.WithJitter(-0.1), "jitter: -0.1 is outside [0, 1]"},
		{"jitter NaN", lockstep.WithJitter(nan()), "jitter: NaN"},
		{"lock ttl", lockstep.WithLockTTL(0), "lock ttl: 0s is not > 0"},
		{"stale ttl", lockstep.WithStale(-time.Second), "stale ttl: -1s is not > 0"},
		{"stale without template", lockstep.WithStale(time.Hour), "stale ttl: the keys have no stale template"},
		{"wait initial", lockstep.WithWait(lockstep.Backoff{Initial: -1}), "wait: initial"},
		{"wait multiplier", lockstep.WithWait(lockstep.Backoff{Multiplier: 0.5}), "wait: multiplier: 0.5 is below 1"},
		{"wait total", lockstep.WithWait(lockstep.Backoff{Total: -time.Second}), "wait: total"},
		{"xfetch beta", lockstep.WithXFetch(0), "xfetch beta: 0 is not > 0"},
		{"sample rate zero", lockstep.WithAccessRecording(0), "access sample rate: 0 is outside (0, 1]"},
		{"sample rate above 1", lockstep.WithAccessRecording(2), "access sample rate: 2 is outside (0, 1]"},
		{"flush interval", lockstep.WithAccessFlushInterval(0), "access flush interval"},
		{"nil recorder", lockstep.WithRecorder(nil), "recorder: nil"},
		{"nil logger", lockstep.WithLogger(nil), "logger: nil"},
		{"nil rand", lockstep.WithRand(nil), "rand: nil"},
		{"nil option", nil, "option: nil"},
	} {
		tests = append(tests, struct {
			name  string
			build func() (*lockstep.Client, error)
			want  []string
		}{o.name, opt(o.o), []string{o.want}})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.build()
			if err == nil {
				_ = c.Close(context.Background())
				t.Fatalf("New succeeded, want an error containing %q", tt.want)
			}
			if !errors.Is(err, lockstep.ErrInvalidArgument) {
				t.Errorf("error %v does not wrap ErrInvalidArgument", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error = %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

func nan() float64 { var z float64; return z / z }

func TestGetInvalidID(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	c := newClient(t, rdb, "product", mustKeys(t, testenv.Prefix(t, rdb), false), func(context.Context, string) ([]byte, error) {
		return []byte("x"), nil
	}, time.Minute)
	for _, id := range []string{"", "bad\xff", strings.Repeat("x", lockstep.MaxIDBytes+1)} {
		if _, err := c.Get(context.Background(), id); !errors.Is(err, lockstep.ErrInvalidID) || !strings.Contains(err.Error(), "invalid id") {
			t.Errorf("Get(%.10q) error = %v, want ErrInvalidID", id, err)
		}
		if err := c.Invalidate(context.Background(), id); !errors.Is(err, lockstep.ErrInvalidID) {
			t.Errorf("Invalidate(%.10q) error = %v, want ErrInvalidID", id, err)
		}
	}
}

func TestInvalidate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, rdb), true)
	ks := mustFor(t, keys, "i")
	var loads atomic.Int64
	c := newClient(t, rdb, "product", keys, func(context.Context, string) ([]byte, error) {
		return []byte("v" + strconv.FormatInt(loads.Add(1), 10)), nil
	}, time.Minute, lockstep.WithStale(time.Hour))
	if v, err := c.Get(ctx, "i"); err != nil || string(v) != "v1" {
		t.Fatalf("Get = %q, %v", v, err)
	}
	rdb.Set(ctx, ks.Lock, "someone", time.Minute)
	if err := c.Invalidate(ctx, "i"); err != nil {
		t.Fatalf("Invalidate: %v", err)
	}
	if n := rdb.Exists(ctx, ks.Cache, ks.Meta, ks.Lock).Val(); n != 0 {
		t.Errorf("%d of cache, meta, lock survive Invalidate, want 0 (the lock too: an in-flight rebuild must not publish)", n)
	}
	if n := rdb.Exists(ctx, ks.Stale).Val(); n != 1 {
		t.Errorf("stale copy removed by Invalidate, want it left alone")
	}
	if v, err := c.Get(ctx, "i"); err != nil || string(v) != "v2" {
		t.Fatalf("Get after Invalidate = %q, %v; want a rebuild (v2)", v, err)
	}
}

// TestGetRoundTrips counts round trips with a hook: a hit is 1 (GET), a hit with XFetch is 1 (GET+PTTL pipelined,
// plus HGET of δ with meta), and a miss is the GET plus a rebuild of exactly 2: SET NX+GET pipelined, then EVALSHA
// publish.
func TestGetRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, rdb), true)
	load := func(_ context.Context, id string) ([]byte, error) { return []byte(id), nil }
	plain := newClient(t, rdb, "product", keys, load, time.Minute, lockstep.WithStale(time.Hour))
	xf := newClient(t, rdb, "product", keys, load, time.Minute, lockstep.WithXFetch(1), lockstep.WithRand(func() float64 { return 0 }))
	xfMeta := newClient(t, rdb, "product", keys, load, time.Minute, lockstep.WithXFetch(1), lockstep.WithMeta(true),
		lockstep.WithRand(func() float64 { return 0 }))
	if _, err := plain.Get(ctx, "warm-up"); err != nil { // loads the publish script; opens the connection
		t.Fatal(err)
	}
	h := testenv.CountCommands(rdb)
	tests := []struct {
		name string
		c    *lockstep.Client
		id   string
		want map[string]int64 // round trips by shape
	}{
		{"miss", plain, "m", map[string]int64{"GET": 1, "SET+GET": 1, "EVALSHA": 1}},
		{"hit", plain, "m", map[string]int64{"GET": 1}},
		{"xfetch hit", xf, "m", map[string]int64{"GET+PTTL": 1}},
		{"xfetch miss", xf, "n", map[string]int64{"GET+PTTL": 1, "SET+GET": 1, "EVALSHA": 1}},
		{"xfetch hit with meta", xfMeta, "m", map[string]int64{"GET+PTTL+HGET": 1}},
		{"xfetch miss with meta", xfMeta, "o", map[string]int64{"GET+PTTL+HGET": 1, "SET+GET": 1, "EVALSHA": 1}},
	}
	for _, tt := range tests {
		h.Reset()
		if _, err := tt.c.Get(ctx, tt.id); err != nil {
			t.Fatalf("%s: Get: %v", tt.name, err)
		}
		if got := h.RoundTrips(); !maps.Equal(got, tt.want) {
			t.Errorf("%s: round trips = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestAccessRecording(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	keys := mustKeys(t, prefix, false)
	load := func(_ context.Context, id string) ([]byte, error) { return []byte(id), nil }

	t.Run("flushed on close, weighted by 1/rate", func(t *testing.T) {
		keyspace := prefix + "weighted"
		c, err := lockstep.New(rdb, keyspace, keys, load, time.Minute, lockstep.WithAccessRecording(0.5),
			lockstep.WithAccessFlushInterval(time.Hour), lockstep.WithRand(func() float64 { return 0.25 })) // every read sampled
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"a", "a", "a", "b"} {
			if _, err := c.Get(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		key := lockstep.AccessKey(keyspace)
		if n := rdb.Exists(ctx, key).Val(); n != 0 {
			t.Fatalf("access set written before the flush")
		}
		if err := c.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		got := rdb.ZRangeWithScores(ctx, key, 0, -1).Val()
		want := []redis.Z{{Score: 2, Member: "b"}, {Score: 6, Member: "a"}}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("ZRANGE %s WITHSCORES = %v, want %v", key, got, want)
		}
		if key != "keepwarm:access:"+keyspace {
			t.Errorf("AccessKey = %q", key)
		}
	})
	t.Run("not sampled", func(t *testing.T) {
		keyspace := prefix + "unsampled"
		c := newClient(t, rdb, keyspace, keys, load, time.Minute, lockstep.WithAccessRecording(0.5),
			lockstep.WithRand(func() float64 { return 0.75 })) // no read sampled
		if _, err := c.Get(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if n := rdb.Exists(ctx, lockstep.AccessKey(keyspace)).Val(); n != 0 {
			t.Fatalf("access set written although no read was sampled")
		}
	})
	t.Run("flushed in the background", func(t *testing.T) {
		keyspace := prefix + "background"
		c := newClient(t, rdb, keyspace, keys, load, time.Minute, lockstep.WithAccessRecording(1),
			lockstep.WithAccessFlushInterval(10*time.Millisecond))
		if _, err := c.Get(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for rdb.ZScore(ctx, lockstep.AccessKey(keyspace), "a").Val() != 1 {
			if time.Now().After(deadline) {
				t.Fatal("the flusher never wrote the access count")
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}

// TestXFetchRefreshesInBackground: with XFetch always firing, a hit returns the cached value at once and the
// refresh publishes the new one in the background; Close waits for it.
func TestXFetchRefreshesInBackground(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, rdb), false)
	ks := mustFor(t, keys, "x")
	tok := acquire(t, rdb, ks, time.Minute)
	if err := lockstep.Publish(ctx, rdb, lockstep.Write{Keys: ks, Token: tok, Value: []byte("old"), TTL: time.Minute, Rebuild: time.Second}); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	rec := newCountingRecorder()
	c, err := lockstep.New(rdb, "product", keys, func(context.Context, string) ([]byte, error) {
		<-release
		return []byte("new"), nil
	}, time.Minute, lockstep.WithXFetch(1), lockstep.WithRecorder(rec), lockstep.WithMeta(true),
		lockstep.WithRand(func() float64 { return 1 - 1e-300 })) // u = 1e-300: −δβ ln u ≈ 690s ≥ 60s remaining
	if err != nil {
		t.Fatal(err)
	}
	v, err := c.Get(ctx, "x")
	if err != nil || string(v) != "old" {
		t.Fatalf("Get = %q, %v; want the cached value at once", v, err)
	}
	if n := rec.early.Load(); n != 1 {
		t.Errorf("early refreshes = %d, want 1", n)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := c.Close(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close while a refresh runs = %v, want DeadlineExceeded", err)
	}
	if _, err := c.Get(ctx, "x"); !errors.Is(err, lockstep.ErrClosed) {
		t.Errorf("Get after Close = %v, want ErrClosed", err)
	}
	close(release)
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := rdb.Get(ctx, ks.Cache).Val(); got != "new" {
		t.Fatalf("cache = %q after the background refresh, want new", got)
	}
	if n := rec.rebuildCount(lockstep.ResultOK); n != 1 {
		t.Errorf("rebuilds ok = %d, want 1", n)
	}
}

func TestGetContextCanceledWhileWaiting(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, rdb), false)
	ks := mustFor(t, keys, "c")
	rdb.Set(context.Background(), ks.Lock, "another-process", time.Minute)
	c := newClient(t, rdb, "product", keys, func(context.Context, string) ([]byte, error) { return []byte("x"), nil }, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Get(ctx, "c")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get = %v, want context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Get returned %v after its context ended", took)
	}
}

// TestNoMetaByDefault: a Client keeps no meta hash unless WithMeta(true), and its write deletes one left by an
// older write (with the fail-safe's stale_since_ms), so that the value is all Redis holds for the id.
func TestNoMetaByDefault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, rdb), false)
	load := func(_ context.Context, id string) ([]byte, error) { return []byte("v" + id), nil }
	plain := newClient(t, rdb, "product", keys, load, time.Minute)
	withMeta := newClient(t, rdb, "product", keys, load, time.Minute, lockstep.WithMeta(true))
	tests := []struct {
		name     string
		c        *lockstep.Client
		id       string
		leftover bool // a meta hash exists before the write
		wantMeta bool
	}{
		{"default", plain, "a", false, false},
		{"default deletes a leftover", plain, "b", true, false},
		{"with meta", withMeta, "c", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ks := mustFor(t, keys, tt.id)
			if tt.leftover {
				rdb.HSet(ctx, ks.Meta, lockstep.MetaDeltaField, "7", lockstep.MetaStaleSinceField, "1")
			}
			if v, err := tt.c.Get(ctx, tt.id); err != nil || string(v) != "v"+tt.id {
				t.Fatalf("Get = %q, %v", v, err)
			}
			if got := rdb.Exists(ctx, ks.Meta).Val() == 1; got != tt.wantMeta {
				t.Errorf("meta hash exists = %v, want %v", got, tt.wantMeta)
			}
			if tt.wantMeta {
				if ttl := rdb.PTTL(ctx, ks.Meta).Val(); ttl <= 0 {
					t.Errorf("meta PTTL = %v, want the value's TTL", ttl)
				}
			}
		})
	}
}

// TestXFetchOwnDelta: without meta, XFetch uses the rebuild time the Client measured itself: it cannot fire
// before the Client has rebuilt a value once, and fires afterwards (u tiny: −δβ ln u far above the TTL left).
func TestXFetchOwnDelta(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, rdb), false)
	// An app that keeps no meta wrote "x"; this Client has never rebuilt anything.
	ks := mustFor(t, keys, "x")
	tok := acquire(t, rdb, ks, time.Minute)
	if err := lockstep.Publish(ctx, rdb, lockstep.Write{Keys: ks, Token: tok, Value: []byte("old"), TTL: time.Minute, NoMeta: true}); err != nil {
		t.Fatal(err)
	}
	rec := newCountingRecorder()
	c := newClient(t, rdb, "product", keys, func(context.Context, string) ([]byte, error) {
		time.Sleep(10 * time.Millisecond) // δ ≈ 10 ms
		return []byte("new"), nil
	}, time.Minute, lockstep.WithXFetch(1e6), lockstep.WithRecorder(rec), // −δβ ln u ≈ 10 ms × 1e6 × 690 ≫ 60 s left
		lockstep.WithRand(func() float64 { return 1 - 1e-300 }))
	if _, err := c.Get(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if n := rec.early.Load(); n != 0 {
		t.Fatalf("early refreshes before any rebuild = %d, want 0 (no δ known)", n)
	}
	if _, err := c.Get(ctx, "y"); err != nil { // a miss: the Client measures its first rebuild
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if n := rec.early.Load(); n != 1 {
		t.Errorf("early refreshes after one rebuild = %d, want 1 (δ measured by the Client)", n)
	}
	testenv.Eventually(t, 5*time.Second, "background refresh published", func() bool { return rdb.Get(ctx, ks.Cache).Val() == "new" })
}
