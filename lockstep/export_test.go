package lockstep

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// UseSetNXFallback makes c acquire locks as on a server older than Redis 7.0, which refuses SET NX GET: a plain
// SET NX and, on a nil reply, a GET of the lock (see acquireOp). Tests use it to run the fallback against Redis 7.
func UseSetNXFallback(c RedisClient) { markRefusesSetGet(c) }

// UsesSetNXFallback reports whether c has switched to the fallback.
func UsesSetNXFallback(c RedisClient) bool { return refusesSetGet(c) }

// RefusedSetGet is refusedSetGet, for the test that matches it against a real server's syntax error.
var RefusedSetGet = refusedSetGet

// AcquireRefusedFirst is Acquire whose first command gets the reply a server older than Redis 7.0 gives SET NX
// GET: it sends "SET key token NX XX", which Redis 7 refuses with the same "ERR syntax error", then settles the
// acquisition as Acquire does (finishAcquires: resend as plain SET NX, remember the client).
func AcquireRefusedFirst(ctx context.Context, c RedisClient, key, token string, ttl time.Duration) (bool, error) {
	op := newAcquireOp(ctx, c, key, token, ttl)
	if !op.get {
		panic("AcquireRefusedFirst: the client already uses the fallback")
	}
	op.cmd = redis.NewCmd(ctx, "set", key, token, "nx", "xx")
	op.cmd.SetFirstKeyPos(1)
	_ = c.Process(ctx, op.cmd)
	held, replies, err := finishAcquires(ctx, c, []*acquireOp{op})
	if err == nil {
		err = replies[0]
	}
	if err != nil {
		return false, err
	}
	return held[0], nil
}

// NearClientID is the CLIENT ID of c's near cache invalidation connection while it is up, else 0.
func NearClientID(c *Client) int64 { return c.nearTracker.clientID.Load() }

// NearUp reports whether c's near cache is in use (its invalidation connection is up).
func NearUp(c *Client) bool { return c.near.up.Load() }

// NearBytes is the bytes c's near cache holds.
func NearBytes(c *Client) int64 { return c.near.bytes.Load() }

// NearDeadline is the deadline of key's value in c's near cache, or zero when it holds none.
func NearDeadline(c *Client, key string) time.Time {
	sh := c.near.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if el, ok := sh.items[key]; ok {
		return el.Value.(*nearEntry).deadline
	}
	return time.Time{}
}
