package lockstep_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/redis/go-redis/v9"
)

// TestClusterClient runs the protocol through go-redis's ClusterClient: routing by first key (the hand-built
// SET NX, the scripts), pipelines split by node, and SCRIPT LOAD broadcast to every master. scripts/services runs
// no Redis Cluster, so the cluster is the local Redis declared as the one node owning all 16384 slots (go-redis's
// ClusterSlots option for hand-made clusters). It runs SCRIPT FLUSH, so on a private redis-server.
func TestClusterClient(t *testing.T) {
	ctx := context.Background()
	single := testenv.PrivateRedis(t)
	prefix := testenv.Prefix(t, single)
	addr := single.Options().Addr
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: addr}}}}, nil
		},
	})
	t.Cleanup(func() { _ = cc.Close() })
	var rdb redis.UniversalClient = cc

	keys, err := lockstep.NewKeys("{"+prefix+"product}:${id}", "", lockstep.DefaultStaleTemplate, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := keys.CheckCluster(); err != nil {
		t.Fatalf("CheckCluster: %v", err)
	}

	c := newClient(t, rdb, "product", keys, func(_ context.Context, id string) ([]byte, error) { return []byte("v" + id), nil },
		time.Minute, lockstep.WithStale(time.Hour), lockstep.WithXFetch(1))
	for range 2 {
		if v, err := c.Get(ctx, "1"); err != nil || string(v) != "v1" {
			t.Fatalf("Get via ClusterClient = %q, %v", v, err)
		}
	}

	var sets []lockstep.KeySet
	var locks []string
	for i := range 5 {
		ks := mustFor(t, keys, "b"+strconv.Itoa(i))
		sets, locks = append(sets, ks), append(locks, ks.Lock)
	}
	tok := lockstep.NewToken()
	if got, err := lockstep.AcquireMany(ctx, rdb, locks, tok, time.Minute); err != nil || !slices.Equal(got, []bool{true, true, true, true, true}) {
		t.Fatalf("AcquireMany = %v, %v", got, err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	var ws []lockstep.Write
	for _, ks := range sets {
		ws = append(ws, lockstep.Write{Keys: ks, Token: tok, Value: []byte(ks.ID), TTL: time.Minute, StaleTTL: time.Hour})
	}
	errs, err := lockstep.PublishMany(ctx, rdb, ws)
	if err != nil {
		t.Fatalf("PublishMany after SCRIPT FLUSH: %v", err)
	}
	for i, e := range errs {
		if e.Err != nil {
			t.Errorf("PublishMany[%d] = %v", i, e)
		}
	}
	if got := single.Get(ctx, sets[3].Cache).Val(); got != "b3" {
		t.Errorf("%s = %q, want b3", sets[3].Cache, got)
	}
	if err := lockstep.Publish(ctx, rdb, ws[0]); !errors.Is(err, lockstep.ErrLockLost) {
		t.Errorf("second Publish = %v, want ErrLockLost", err)
	}
	if _, err := lockstep.AcquireMany(ctx, rdb, locks, tok, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, err := lockstep.ExtendMany(ctx, rdb, locks, tok, time.Minute); err != nil || !slices.Equal(got, []bool{true, true, true, true, true}) {
		t.Fatalf("ExtendMany = %v, %v", got, err)
	}
	if errs, err := lockstep.ExtendValueMany(ctx, rdb, sets[:2], tok, time.Hour, time.Hour); err != nil || errs[0].Err != nil || errs[1].Err != nil {
		t.Fatalf("ExtendValueMany = %v, %v", errs, err)
	}
	if err := lockstep.ReleaseMany(ctx, rdb, locks, tok); err != nil {
		t.Fatalf("ReleaseMany: %v", err)
	}
	if n := single.Exists(ctx, locks...).Val(); n != 0 {
		t.Errorf("%d locks left, want 0", n)
	}
}
