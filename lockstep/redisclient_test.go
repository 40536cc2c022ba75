package lockstep_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
)

// countingClient is an app's wrapper around a go-redis client that has only lockstep.RedisClient's methods (it
// embeds the narrow interface, not the client) and counts the pipelines it forwards.
type countingClient struct {
	lockstep.RedisClient
	pipelines atomic.Int64
}

func (c *countingClient) Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error) {
	c.pipelines.Add(1)
	return c.RedisClient.Pipelined(ctx, fn)
}

// The Client and the protocol functions work through a wrapper that offers only the narrow interface.
func TestNarrowClientInterface(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	w := &countingClient{RedisClient: rdb}
	keys := mustKeys(t, testenv.Prefix(t, rdb), true)
	c := newClient(t, w, "product", keys, func(context.Context, string) ([]byte, error) { return []byte("v"), nil }, time.Minute)
	if v, err := c.Get(ctx, "1"); err != nil || string(v) != "v" {
		t.Fatalf("Get through the wrapper = %q, %v", v, err)
	}
	if err := c.Invalidate(ctx, "1"); err != nil {
		t.Fatal(err)
	}
	ks := mustFor(t, keys, "2")
	tok := lockstep.NewToken()
	if ok, err := lockstep.AcquireMany(ctx, w, []string{ks.Lock}, tok, time.Minute); err != nil || !ok[0] {
		t.Fatalf("AcquireMany = %v, %v", ok, err)
	}
	res, err := lockstep.PublishMany(ctx, w, []lockstep.Write{{Keys: ks, Token: tok, Value: []byte("x"), TTL: time.Minute}})
	if err != nil || res[0].Err != nil {
		t.Fatalf("PublishMany = %v, %v", res, err)
	}
	if w.pipelines.Load() == 0 {
		t.Error("no pipeline went through the wrapper")
	}
}
