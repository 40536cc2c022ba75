package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults match `scripts/services up cluster` and `scripts/services up sentinel`; the environment
// (`eval "$(scripts/services env)"`, or make test) overrides them.
const (
	DefaultClusterAddrs       = "127.0.0.1:27001,127.0.0.1:27002,127.0.0.1:27003,127.0.0.1:27004,127.0.0.1:27005,127.0.0.1:27006"
	DefaultSentinelAddrs      = "127.0.0.1:27021,127.0.0.1:27022,127.0.0.1:27023"
	DefaultSentinelMasterName = "keepwarm"
)

// ClusterAddrs is KEEPWARM_REDIS_CLUSTER_ADDRS (comma-separated host:port seed nodes) or DefaultClusterAddrs.
func ClusterAddrs() []string {
	return strings.Split(envOr("KEEPWARM_REDIS_CLUSTER_ADDRS", DefaultClusterAddrs), ",")
}

// SentinelAddrs is KEEPWARM_REDIS_SENTINEL_ADDRS (comma-separated Sentinels) or DefaultSentinelAddrs.
func SentinelAddrs() []string {
	return strings.Split(envOr("KEEPWARM_REDIS_SENTINEL_ADDRS", DefaultSentinelAddrs), ",")
}

// SentinelMasterName is KEEPWARM_REDIS_SENTINEL_MASTER_NAME or DefaultSentinelMasterName.
func SentinelMasterName() string {
	return envOr("KEEPWARM_REDIS_SENTINEL_MASTER_NAME", DefaultSentinelMasterName)
}

const howToStartTopology = "start it with `scripts/services up %s` (make test does it), or point %s at a running one"

// Cluster returns a new client of the Redis Cluster that `scripts/services up cluster` starts, once every node
// reports cluster_state:ok (a failover by an earlier test may still be settling: it waits up to 30 s). It fails
// the test, saying how to start the cluster, when it is not there. The client is closed on cleanup.
func Cluster(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	addrs := ClusterAddrs()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	tb.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	var last error
	ok := Poll(30*time.Second, func() bool {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		last = c.ForEachShard(pctx, func(ctx context.Context, n *redis.Client) error {
			info, err := n.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return fmt.Errorf("%s: cluster_state is not ok", n.Options().Addr)
			}
			return nil
		})
		if last == nil {
			last = c.Ping(pctx).Err()
		}
		return last == nil || errors.Is(last, syscall.ECONNREFUSED) // nothing listens: no use waiting
	})
	if !ok || last != nil {
		tb.Fatalf("redis cluster at %s is not healthy (%v): "+howToStartTopology, strings.Join(addrs, ","), last,
			"cluster", "KEEPWARM_REDIS_CLUSTER_ADDRS")
	}
	return c
}

// SentinelClient returns a new failover client of the Sentinel group that `scripts/services up sentinel` starts,
// once its Sentinels name a master that answers and has a connected replica (a failover by an earlier test may
// still be settling: it waits up to 30 s). It fails the test, saying how to start the group, when it is not there.
// The client is closed on cleanup.
func SentinelClient(tb testing.TB) *redis.Client {
	tb.Helper()
	addrs := SentinelAddrs()
	var dialErr error
	for _, a := range addrs {
		conn, err := net.DialTimeout("tcp", a, time.Second)
		if err == nil {
			conn.Close()
			dialErr = nil
			break
		}
		dialErr = err
	}
	if dialErr != nil { // no Sentinel listens: no use waiting
		tb.Fatalf("redis sentinel group %q at %s is not reachable (%v): "+howToStartTopology, SentinelMasterName(),
			strings.Join(addrs, ","), dialErr, "sentinel", "KEEPWARM_REDIS_SENTINEL_ADDRS")
	}
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMasterName(), SentinelAddrs: addrs})
	tb.Cleanup(func() { _ = c.Close() })
	var last error
	ok := Poll(30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		info, err := c.Info(ctx, "replication").Result()
		switch {
		case err != nil:
			last = err
		case !strings.Contains(info, "role:master"):
			last = fmt.Errorf("the Sentinels' master reports no role:master yet")
		case !strings.Contains(info, "connected_slaves:1"):
			last = fmt.Errorf("the master has no connected replica yet")
		default:
			last = nil
		}
		return last == nil || errors.Is(last, syscall.ECONNREFUSED) // nothing listens: no use waiting
	})
	if !ok || last != nil {
		tb.Fatalf("redis sentinel group %q at %s is not healthy (%v): "+howToStartTopology, SentinelMasterName(),
			strings.Join(addrs, ","), last, "sentinel", "KEEPWARM_REDIS_SENTINEL_ADDRS")
	}
	return c
}

// ClusterPrefix is Prefix for a Cluster: a key prefix unique to this test, whose keys are deleted on cleanup from
// every master (a SCAN through the Cluster client would reach one node only).
func ClusterPrefix(tb testing.TB, c *redis.ClusterClient) string {
	tb.Helper()
	name := strings.NewReplacer("/", "_", " ", "_", ":", "_").Replace(tb.Name())
	p := "kwtest:" + name + ":" + randHex(4) + ":"
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			DeleteContaining(n, p)
			return nil
		})
	})
	return p
}
