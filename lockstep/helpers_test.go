package lockstep_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"

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

// roundTrips is a go-redis hook that counts round trips: one per single command and one per pipeline, and keeps
// the command names of each.
type roundTrips struct {
	mu    sync.Mutex
	trips [][]string
}

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.add([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.add(cmds)
		return next(ctx, cmds)
	}
}

func (r *roundTrips) add(cmds []redis.Cmder) {
	names := make([]string, len(cmds))
	for i, c := range cmds {
		names[i] = strings.ToUpper(c.Name())
	}
	r.mu.Lock()
	r.trips = append(r.trips, names)
	r.mu.Unlock()
}

// take returns the round trips since the last take, each as its command names joined by "+".
func (r *roundTrips) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.trips))
	for i, t := range r.trips {
		out[i] = strings.Join(t, "+")
	}
	r.trips = nil
	return out
}
