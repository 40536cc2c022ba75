package lockstep_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/lockstep/lockstepprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// products stands for the origin database.
var products = map[string]string{"42": `{"id":42,"name":"kettle"}`}

// The Examples that talk to Redis have no Output line: `go test` compiles them but does not run them. They
// expect the Redis of scripts/services (127.0.0.1:16379).

// A read-through cache of one keyspace: on a miss, one process loads from the origin while the others wait.
func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:16379"})
	defer rdb.Close()

	keys, err := lockstep.NewKeys("product:${id}", "", lockstep.DefaultStaleTemplate, "")
	if err != nil {
		log.Fatal(err)
	}
	load := func(ctx context.Context, id string) ([]byte, error) {
		v, ok := products[id] // e.g. SELECT row_to_json(p) FROM product p WHERE id = $1
		if !ok {
			return nil, fmt.Errorf("product %s: %w", id, lockstep.ErrNotFound)
		}
		return []byte(v), nil
	}
	reg := prometheus.NewRegistry()
	rec, err := lockstepprom.New(reg)
	if err != nil {
		log.Fatal(err)
	}
	c, err := lockstep.New(rdb, "product", keys, load, 5*time.Minute,
		lockstep.WithStale(24*time.Hour),  // followers serve this if a rebuild takes too long
		lockstep.WithXFetch(1),            // refresh hot keys shortly before they expire
		lockstep.WithAccessRecording(0.1), // tell keepwarm's daemon which ids are hot
		lockstep.WithRecorder(rec),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(context.Background())
}

func ExampleClient_Get() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:16379"})
	defer rdb.Close()
	keys, _ := lockstep.NewKeys("product:${id}", "", "", "")
	c, err := lockstep.New(rdb, "product", keys, func(ctx context.Context, id string) ([]byte, error) {
		return []byte(products[id]), nil
	}, 5*time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(context.Background())

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	v, err := c.Get(ctx, "42")
	switch {
	case errors.Is(err, lockstep.ErrNotFound):
		fmt.Println("no such product") // nothing was cached
	case errors.Is(err, lockstep.ErrRebuildTimeout):
		fmt.Println("busy, try again") // another process is rebuilding and there is no stale copy
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Println(string(v))
	}
}

// The daemon's side of the protocol, by hand: take the lock, rebuild, publish under the token.
func ExamplePublish() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:16379"})
	defer rdb.Close()
	keys, _ := lockstep.NewKeys("product:${id}", "", lockstep.DefaultStaleTemplate, "")
	ks, _ := keys.For("42")

	token := lockstep.NewToken()
	ok, err := lockstep.Acquire(ctx, rdb, ks.Lock, token, 5*time.Second)
	if err != nil || !ok {
		return // someone else is rebuilding (or Redis failed)
	}
	start := time.Now()
	value := []byte(products["42"]) // the rebuild
	err = lockstep.Publish(ctx, rdb, lockstep.Write{
		Keys:     ks,
		Token:    token,
		Value:    value,
		TTL:      lockstep.Jitter(5*time.Minute, 0.1, 0.5),
		StaleTTL: 24 * time.Hour,
		Rebuild:  time.Since(start),
	})
	if errors.Is(err, lockstep.ErrLockLost) {
		fmt.Println("too slow: the lock expired and nothing was written")
	}
}

func ExampleKeys_For() {
	keys, err := lockstep.NewKeys("{product}:${id}", "", lockstep.DefaultStaleTemplate, "")
	if err != nil {
		log.Fatal(err)
	}
	ks, _ := keys.For("42")
	fmt.Println(ks.Cache)
	fmt.Println(ks.Lock)
	fmt.Println(ks.Stale)
	fmt.Println(ks.Meta)
	fmt.Println(keys.CheckCluster())
	// Output:
	// {product}:42
	// lock:{product}:42
	// stale:{product}:42
	// meta:{product}:42
	// <nil>
}

func ExampleKeys_CheckCluster() {
	keys, _ := lockstep.NewKeys("product:${id}", "locks:{all}:${id}", "", "")
	fmt.Println(keys.CheckCluster())
	// Output:
	// key template "product:${id}": no fixed Redis Cluster hash tag: start the key with a literal tag such as "{name}:" so all of one id's keys share a slot
}

func ExampleJitter() {
	// A 10-minute TTL with 10% jitter lands in [10m, 11m).
	for _, u := range []float64{0, 0.5, 0.999} {
		fmt.Println(lockstep.Jitter(10*time.Minute, 0.1, u))
	}
	// Output:
	// 10m0s
	// 10m30s
	// 10m59.94s
}

func ExampleXFetch() {
	now := time.Now()
	expiry := now.Add(2 * time.Second) // 2s left
	delta := time.Second               // the last rebuild took 1s
	// P(refresh) = exp(−2s/(1s·1)) ≈ 0.135: only a u below that refreshes now.
	fmt.Println(lockstep.XFetch(now, expiry, delta, 1, 0.5))
	fmt.Println(lockstep.XFetch(now, expiry, delta, 1, 0.1))
	// Output:
	// false
	// true
}

// A near cache: hot values also held in process memory (at most 64 MiB), dropped as soon as Redis reports a
// change of their key by any writer, and never served more than 5 s after they were read from Redis.
func ExampleWithNearCache() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:16379"})
	defer rdb.Close()

	keys, err := lockstep.NewKeys("product:${id}", "", "", "")
	if err != nil {
		log.Fatal(err)
	}
	load := func(ctx context.Context, id string) ([]byte, error) { return []byte(products[id]), nil }
	c, err := lockstep.New(rdb, "product", keys, load, time.Minute,
		lockstep.WithNearCache(lockstep.NearCache{MaxBytes: 64 << 20, MaxStaleness: 5 * time.Second}))
	if err != nil {
		log.Fatal(err) // e.g. lockstep.ErrNearUnsupported for a Cluster client
	}
	defer c.Close(context.Background())

	v, err := c.Get(context.Background(), "42") // from memory once held; else from Redis, else the origin
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(v))
}
