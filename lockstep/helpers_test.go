package lockstep_test

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/redis/go-redis/v9"
)

// mustKeys builds a keyspace layout under prefix: cache "<prefix>product:${id}", default lock and meta, and
// the default stale template when stale is true.
func mustKeys(tb testing.TB, prefix string, stale bool) *lockstep.Keys {
	tb.Helper()
	st := ""
	if stale {
		st = lockstep.DefaultStaleTemplate
	}
	k, err := lockstep.NewKeys(prefix+"product:${id}", "", st, "")
	if err != nil {
		tb.Fatalf("NewKeys: %v", err)
	}
	return k
}

func mustFor(tb testing.TB, k *lockstep.Keys, id string) lockstep.KeySet {
	tb.Helper()
	ks, err := k.For(id)
	if err != nil {
		tb.Fatalf("For(%q): %v", id, err)
	}
	return ks
}

// isHandshake reports whether cmds are a new connection's HELLO/CLIENT SETINFO handshake, which go-redis sends
// through the hooks too; they are per connection, not per request, so round-trip counts leave them out.
func isHandshake(cmds []redis.Cmder) bool {
	n := cmds[0].Name()
	return n == "hello" || n == "client" || n == "auth" || n == "select"
}

// tripCounter counts round trips for the benchmarks. It is not testenv.Commands on purpose: one atomic add and
// no allocation per round trip, so that it does not show in the benchmarks' ns/op and allocs/op.
type tripCounter struct{ n atomic.Int64 }

func (h *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !isHandshake([]redis.Cmder{cmd}) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !isHandshake(cmds) {
			h.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// countingRecorder is a Recorder that counts every event; onContention, when set, runs when a Get becomes a
// follower (tests use it to act at exactly that moment instead of sleeping).
type countingRecorder struct {
	hits, misses, stale, contention, early atomic.Int64
	mu                                     sync.Mutex
	rebuilds                               map[string]int // by result
	waits                                  map[string]int // by result
	onContention                           func()
}

func newCountingRecorder() *countingRecorder {
	return &countingRecorder{rebuilds: map[string]int{}, waits: map[string]int{}}
}

func (r *countingRecorder) Hit(string)        { r.hits.Add(1) }
func (r *countingRecorder) Miss(string)       { r.misses.Add(1) }
func (r *countingRecorder) StaleServe(string) { r.stale.Add(1) }
func (r *countingRecorder) EarlyRefresh(string) {
	r.early.Add(1)
}
func (r *countingRecorder) LockContention(string) {
	r.contention.Add(1)
	if r.onContention != nil {
		r.onContention()
	}
}
func (r *countingRecorder) Rebuild(_ string, _ time.Duration, result string) {
	r.mu.Lock()
	r.rebuilds[result]++
	r.mu.Unlock()
}
func (r *countingRecorder) Wait(_ string, _ time.Duration, result string) {
	r.mu.Lock()
	r.waits[result]++
	r.mu.Unlock()
}
func (r *countingRecorder) rebuildCount(result string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rebuilds[result]
}
func (r *countingRecorder) waitCount(result string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waits[result]
}

// newClient makes a Client and closes it on cleanup.
func newClient(tb testing.TB, rdb lockstep.RedisClient, keyspace string, keys *lockstep.Keys, load lockstep.Loader, ttl time.Duration, opts ...lockstep.Option) *lockstep.Client {
	tb.Helper()
	opts = append([]lockstep.Option{lockstep.WithLogger(slog.New(slog.DiscardHandler))}, opts...)
	c, err := lockstep.New(rdb, keyspace, keys, load, ttl, opts...)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return c
}

// lockedRand is a seeded, mutex-guarded source for WithRand.
func lockedRand(seed uint64) func() float64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Float64()
	}
}

// checkGet fails the test unless Get returned want (wantErr nil) or an error matching wantErr.
func checkGet(tb testing.TB, v []byte, err error, want string, wantErr error) {
	tb.Helper()
	if wantErr != nil {
		if !errors.Is(err, wantErr) {
			tb.Fatalf("Get = %q, %v; want %v", v, err, wantErr)
		}
	} else if err != nil || string(v) != want {
		tb.Fatalf("Get = %q, %v; want %q", v, err, want)
	}
}
