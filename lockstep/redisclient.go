package lockstep

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// RedisClient is the part of a go-redis v9 client that lockstep uses: the script commands (redis.Scripter),
// Process and Pipelined, GET and DEL. *redis.Client, *redis.ClusterClient, *redis.Ring, a Sentinel failover
// client and redis.UniversalClient all satisfy it, and so does an app's own wrapper that forwards these methods
// (for tracing, say), as redislock's RedisClient allows.
type RedisClient interface {
	redis.Scripter
	Process(ctx context.Context, cmd redis.Cmder) error
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
	Get(ctx context.Context, key string) *redis.StringCmd
	Del(ctx context.Context, keys ...string) *redis.IntCmd
}

var _ RedisClient = redis.UniversalClient(nil)
