package stream_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/sources/postgres/stream"
)

// TestStreamLeaseOneHolderAndTakeover: of two daemons one streams; when it can no longer reach Redis (as after
// kill -9, its lease is not renewed), it stops streaming and the standby takes over within the lease TTL plus
// one attempt period.
func TestStreamLeaseOneHolderAndTakeover(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	key := testenv.Prefix(t, rdb) + "stream-lease"
	const ttl = time.Second
	rdbA := redis.NewClient(rdb.Options())
	a, err := stream.NewLease(rdbA, key, ttl, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := stream.NewLease(rdb, key, ttl, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	var streaming atomic.Int32 // daemons streaming at once
	var maxStreaming atomic.Int32
	var aStopped, bStarted atomic.Bool
	fn := func(which string) func(context.Context) error {
		return func(ctx context.Context) error {
			n := streaming.Add(1)
			for m := maxStreaming.Load(); n > m && !maxStreaming.CompareAndSwap(m, n); m = maxStreaming.Load() {
			}
			if which == "b" {
				bStarted.Store(true)
			}
			<-ctx.Done()
			streaming.Add(-1)
			if which == "a" {
				aStopped.Store(true)
			}
			return nil
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Add(1)
	go func() { defer wg.Done(); _ = a.Run(ctx, fn("a")) }()
	testenv.Eventually(t, 5*time.Second, "a holds the lease", func() bool { return a.Status().State == "holder" })
	wg.Add(1)
	go func() { defer wg.Done(); _ = b.Run(ctx, fn("b")) }()
	testenv.Eventually(t, 5*time.Second, "b stands by", func() bool { return b.Status().State == "standby" })
	// b keeps standing by while a renews (three TTLs).
	if testenv.Poll(3*ttl, func() bool { return bStarted.Load() }) {
		t.Fatal("b streamed while a held the lease")
	}
	killed := time.Now()
	_ = rdbA.Close() // a can no longer renew: as if it were killed
	testenv.Eventually(t, 5*time.Second, "b takes over", func() bool { return bStarted.Load() })
	took := time.Since(killed)
	testenv.Eventually(t, 5*time.Second, "a stops streaming", func() bool { return aStopped.Load() })
	if took > 3*ttl {
		t.Errorf("takeover took %v, want at most 3 × ttl %v (ttl + ttl/5 + scheduling on a loaded machine)", took, ttl)
	}
	// a stops when its renewals fail for half the TTL, before its lease can expire: never two streams at once.
	if got := maxStreaming.Load(); got != 1 {
		t.Errorf("daemons streaming at once: got %d, want 1", got)
	}
}
