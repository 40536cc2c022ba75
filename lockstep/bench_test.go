package lockstep_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
)

// Run with: go test -run '^$' -bench . -benchmem ./lockstep (needs the Redis of scripts/services).

func benchClient(b *testing.B, opts ...lockstep.Option) (*lockstep.Client, *tripCounter, *lockstep.Keys) {
	b.Helper()
	rdb := testenv.Redis(b)
	keys := mustKeys(b, testenv.Prefix(b, rdb), false)
	h := &tripCounter{}
	rdb.AddHook(h)
	c := newClient(b, rdb, "product", keys, func(_ context.Context, id string) ([]byte, error) {
		return []byte(`{"id":"` + id + `","name":"a product","price":1999}`), nil
	}, time.Hour, opts...)
	return c, h, keys
}

// BenchmarkClientGetHit is the hit path: one GET round trip.
func BenchmarkClientGetHit(b *testing.B) {
	ctx := context.Background()
	c, h, _ := benchClient(b)
	if _, err := c.Get(ctx, "1"); err != nil {
		b.Fatal(err)
	}
	h.n.Store(0)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Get(ctx, "1"); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(h.n.Load())/float64(b.N), "roundtrips/op")
}

// BenchmarkRedisGetBaseline is a bare go-redis GET of the same value, the floor for BenchmarkClientGetHit.
func BenchmarkRedisGetBaseline(b *testing.B) {
	ctx := context.Background()
	rdb := testenv.Redis(b)
	key := testenv.Prefix(b, rdb) + "product:1"
	rdb.Set(ctx, key, `{"id":"1","name":"a product","price":1999}`, time.Hour)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := rdb.Get(ctx, key).Bytes(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClientGetHitXFetch is the hit path with XFetch: GET, PTTL and HGET δ in one pipelined round trip.
func BenchmarkClientGetHitXFetch(b *testing.B) {
	ctx := context.Background()
	c, h, _ := benchClient(b, lockstep.WithXFetch(1))
	if _, err := c.Get(ctx, "1"); err != nil {
		b.Fatal(err)
	}
	h.n.Store(0)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Get(ctx, "1"); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(h.n.Load())/float64(b.N), "roundtrips/op")
}

// BenchmarkClientGetHitParallel is the hit path from GOMAXPROCS goroutines sharing one Client and pool.
func BenchmarkClientGetHitParallel(b *testing.B) {
	ctx := context.Background()
	c, _, _ := benchClient(b)
	if _, err := c.Get(ctx, "1"); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Get(ctx, "1"); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkClientGetMiss is a Get of a missing key with an instant loader: the first GET, then the rebuild (SET NX
// pipelined with a re-check GET, then the publish script). roundtrips/op counts all of them with a go-redis hook;
// rebuild_roundtrips/op leaves out the first GET and should be 2.
func BenchmarkClientGetMiss(b *testing.B) {
	ctx := context.Background()
	c, h, _ := benchClient(b)
	if _, err := c.Get(ctx, "warm-up"); err != nil { // loads the publish script
		b.Fatal(err)
	}
	h.n.Store(0)
	var i atomic.Int64
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Get(ctx, "miss-"+strconv.FormatInt(i.Add(1), 10)); err != nil {
			b.Fatal(err)
		}
	}
	trips := float64(h.n.Load()) / float64(b.N)
	b.ReportMetric(trips, "roundtrips/op")
	b.ReportMetric(trips-1, "rebuild_roundtrips/op")
}

// BenchmarkAcquireRelease is one lock cycle: SET NX PX, then the release script.
func BenchmarkAcquireRelease(b *testing.B) {
	ctx := context.Background()
	rdb := testenv.Redis(b)
	lock := testenv.Prefix(b, rdb) + "lock:bench"
	b.ReportAllocs()
	for b.Loop() {
		tok := lockstep.NewToken()
		if ok, err := lockstep.Acquire(ctx, rdb, lock, tok, time.Second); err != nil || !ok {
			b.Fatal(ok, err)
		}
		if ok, err := lockstep.Release(ctx, rdb, lock, tok); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}

// BenchmarkPublishMany100 is what the daemon does per refresh batch: AcquireMany then PublishMany of 100 keys,
// two round trips. ns/op is per batch of 100.
func BenchmarkPublishMany100(b *testing.B) {
	ctx := context.Background()
	rdb := testenv.Redis(b)
	keys := mustKeys(b, testenv.Prefix(b, rdb), true)
	const n = 100
	sets := make([]lockstep.KeySet, n)
	locks := make([]string, n)
	for i := range sets {
		sets[i] = mustFor(b, keys, strconv.Itoa(i))
		locks[i] = sets[i].Lock
	}
	value := []byte(`{"id":1,"name":"a product","price":1999}`)
	ws := make([]lockstep.Write, n)
	b.ReportAllocs()
	for b.Loop() {
		tok := lockstep.NewToken()
		if _, err := lockstep.AcquireMany(ctx, rdb, locks, tok, 5*time.Second); err != nil {
			b.Fatal(err)
		}
		for i := range ws {
			ws[i] = lockstep.Write{Keys: sets[i], Token: tok, Value: value, TTL: time.Hour, StaleTTL: 24 * time.Hour, Rebuild: time.Millisecond}
		}
		errs, err := lockstep.PublishMany(ctx, rdb, ws)
		if err != nil || errs[0].Err != nil {
			b.Fatal(err, errs[0].Err)
		}
	}
}

func BenchmarkJitter(b *testing.B) {
	var sink time.Duration
	u := 0.0
	for b.Loop() {
		u += 0.001
		if u >= 1 {
			u = 0
		}
		sink += lockstep.Jitter(time.Minute, 0.1, u)
	}
	_ = sink
}

func BenchmarkXFetch(b *testing.B) {
	now := time.Now()
	exp := now.Add(time.Second)
	n := 0
	u := 0.0
	for b.Loop() {
		u += 0.001
		if u > 1 {
			u = 0.001
		}
		if lockstep.XFetch(now, exp, 100*time.Millisecond, 1, u) {
			n++
		}
	}
	_ = n
}

// BenchmarkClientGetNearHit is the hit path with the near cache (WithNearCache): no round trip. Compare it with
// BenchmarkClientGetHit in the same run.
func BenchmarkClientGetNearHit(b *testing.B) {
	ctx := context.Background()
	c, h, _ := benchClient(b, lockstep.WithNearCache(lockstep.NearCache{MaxBytes: 1 << 20, MaxStaleness: time.Minute}))
	testenv.Eventually(b, 5*time.Second, "near cache holds the value", func() bool {
		before := h.n.Load()
		_, err := c.Get(ctx, "1")
		return err == nil && h.n.Load() == before
	})
	h.n.Store(0)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Get(ctx, "1"); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(h.n.Load())/float64(b.N), "roundtrips/op")
}
