package lockstep_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
)

// faultRedisTimeout is the Redis timeout of the fault tests' clients, and faultGetBound what a Get may take when
// Redis does not answer: a few bounded round trips (read, stale fallback; lock, stale fallback) with a margin for
// a loaded machine. go-redis's own defaults (5s read timeout, 3 retries) take far longer.
const (
	faultRedisTimeout = 200 * time.Millisecond
	faultGetBound     = 3 * time.Second
)

// proxied returns a go-redis client (go-redis's default timeouts and retries unless ctxTimeout) to the Redis at
// addr, with poolSize connections opened in each of its two pools (go-redis runs pipelines on a pool of their
// own) before it returns, so that commands sent during a fault travel on connections that exist: a new
// connection's handshake would be caught by the fault first, and its commands never sent.
func proxied(t *testing.T, addr string, ctxTimeout bool, poolSize int) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: ctxTimeout, PoolSize: poolSize,
		PipelinePoolSize: poolSize})
	t.Cleanup(func() { _ = c.Close() })
	// Each warm-up call blocks in BLPOP for 1s, so poolSize concurrent ones need poolSize connections.
	var wg sync.WaitGroup
	errs := make(chan error, 2*poolSize)
	for i := range 2 * poolSize {
		wg.Go(func() {
			ctx := context.Background()
			if i%2 == 0 {
				errs <- c.BLPop(ctx, time.Second, "lockstep-warmup-never-pushed").Err()
				return
			}
			_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				p.BLPop(ctx, time.Second, "lockstep-warmup-never-pushed")
				return nil
			})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("warm up the connection pools: %v", err)
		}
	}
	return c
}

// TestGetBoundedWhileRedisStalls: while the link to Redis is a black hole, every Get of many goroutines in two
// clients returns within a few Redis timeouts with ErrRedisTimeout, on the hit and the miss path, whether or not
// go-redis honours context deadlines; the loader is never called. Before the bound, a Get whose context had no
// deadline waited for go-redis's read timeout and retries.
func TestGetBoundedWhileRedisStalls(t *testing.T) {
	t.Parallel()
	for _, ctxTimeout := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", ctxTimeout), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			direct := testenv.Redis(t)
			keys := mustKeys(t, testenv.Prefix(t, direct), true)
			direct.Set(ctx, mustFor(t, keys, "hit").Cache, "v", time.Hour)
			fp := testenv.Proxy(t, testenv.RedisAddr(t))
			var loads atomic.Int64
			load := func(context.Context, string) ([]byte, error) { loads.Add(1); return []byte("fresh"), nil }
			var clients []*lockstep.Client
			for range 2 {
				rdb := proxied(t, fp.Addr(), ctxTimeout, 4)
				clients = append(clients, newClient(t, rdb, "product", keys, load, time.Minute,
					lockstep.WithRedisTimeout(faultRedisTimeout), lockstep.WithLockTTL(time.Minute)))
			}
			fp.Stall()
			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for i := range 32 {
				c := clients[i%2]
				id := "hit"
				if i%4 >= 2 {
					id = "miss" + strconv.Itoa(i)
				}
				wg.Go(func() {
					start := time.Now()
					v, err := c.Get(ctx, id) // no deadline: only the client's bound ends it
					took := time.Since(start)
					switch {
					case err == nil:
						errs <- fmt.Errorf("Get(%q) = %q, nil during a stall; want an error", id, v)
					case !errors.Is(err, lockstep.ErrRedisTimeout) || !errors.Is(err, context.DeadlineExceeded):
						errs <- fmt.Errorf("Get(%q) error = %v; want ErrRedisTimeout and DeadlineExceeded", id, err)
					case took > faultGetBound:
						errs <- fmt.Errorf("Get(%q) took %v, want < %v (Redis timeout %v)", id, took, faultGetBound, faultRedisTimeout)
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if n := loads.Load(); n != 0 {
				t.Errorf("loader called %d times while Redis stalled, want 0", n)
			}
			fp.Heal()
			testenv.Eventually(t, 20*time.Second, "a hit after Heal", func() bool {
				v, err := clients[0].Get(ctx, "hit")
				return err == nil && string(v) == "v"
			})
		})
	}
}

// TestGetServesStaleWhenAConnectionStalls: the connection a Get reads on stalls (a half-open connection, a
// stalled path) while Redis itself still answers on a new one. Get gives up on the read at the Redis timeout and
// serves the value, else the stale copy, read over a new connection, instead of an error. The faulty path is a
// fault proxy that only the first connection goes through.
func TestGetServesStaleWhenAConnectionStalls(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, cache, stale string
		want               string
		wantStale          int64
		wantErr            error
	}{
		{name: "value present", cache: "fresh", stale: "old", want: "fresh"},
		{name: "only the stale copy", stale: "old", want: "old", wantStale: 1},
		{name: "nothing", wantErr: lockstep.ErrRedisTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			direct := testenv.Redis(t)
			keys := mustKeys(t, testenv.Prefix(t, direct), true)
			ks := mustFor(t, keys, "1")
			if tt.cache != "" {
				direct.Set(ctx, ks.Cache, tt.cache, time.Hour)
			}
			if tt.stale != "" {
				direct.Set(ctx, ks.Stale, tt.stale, time.Hour)
			}
			faulty := testenv.Proxy(t, testenv.RedisAddr(t))
			healthy := testenv.Proxy(t, testenv.RedisAddr(t))
			var dials atomic.Int64
			rdb := redis.NewClient(&redis.Options{Addr: faulty.Addr(), PoolSize: 4,
				Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
					addr := healthy.Addr()
					if dials.Add(1) == 1 {
						addr = faulty.Addr()
					}
					var d net.Dialer
					return d.DialContext(ctx, network, addr)
				}})
			t.Cleanup(func() { _ = rdb.Close() })
			if err := rdb.Ping(ctx).Err(); err != nil { // opens the first connection, through the faulty proxy
				t.Fatal(err)
			}
			rec := newCountingRecorder()
			load := func(context.Context, string) ([]byte, error) {
				return nil, errors.New("the loader must not be called")
			}
			c := newClient(t, rdb, "product", keys, load, time.Minute, lockstep.WithRecorder(rec),
				lockstep.WithRedisTimeout(faultRedisTimeout), lockstep.WithLockTTL(time.Minute))
			faulty.Stall()
			start := time.Now()
			v, err := c.Get(ctx, "1")
			took := time.Since(start)
			checkGet(t, v, err, tt.want, tt.wantErr)
			if took > faultGetBound {
				t.Errorf("Get took %v, want < %v", took, faultGetBound)
			}
			if n := rec.stale.Load(); n != tt.wantStale {
				t.Errorf("stale serves = %d, want %d", n, tt.wantStale)
			}
		})
	}
}

// missBarrier is a Recorder whose Miss blocks until n Gets have missed, then runs atMiss once: the test acts at
// the moment between a Get's read (a miss) and its lock acquisition, without sleeping.
type missBarrier struct {
	lockstep.NopRecorder
	n      int
	atMiss func()
	mu     sync.Mutex
	seen   int
	open   chan struct{}
}

func (b *missBarrier) Miss(string) {
	b.mu.Lock()
	b.seen++
	if b.seen == b.n {
		b.atMiss()
		close(b.open)
	}
	b.mu.Unlock()
	<-b.open
}

// TestNoOrphanedLocksAfterFreeze: Redis freezes (commands queue and run when it wakes, after the clients gave up)
// just as many goroutines of two clients have missed and send their SET NX. Every Get fails within the bound, and
// once Redis runs the queued SET NX, the clients release those locks, long before the one-minute lock TTL. It uses
// a private redis-server so that INFO commandstats proves the queued SETs did run.
func TestNoOrphanedLocksAfterFreeze(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := testenv.PrivateRedis(t)
	keys := mustKeys(t, "", false)
	fp := testenv.Proxy(t, direct.Options().Addr)
	const gets = 16
	rec := &missBarrier{n: gets, open: make(chan struct{}), atMiss: func() {
		_ = direct.ConfigResetStat(ctx).Err()
		fp.Freeze(time.Hour)
	}}
	var loads atomic.Int64
	load := func(context.Context, string) ([]byte, error) { loads.Add(1); return []byte("v"), nil }
	var clients []*lockstep.Client
	for _, ctxTimeout := range []bool{false, true} {
		rdb := proxied(t, fp.Addr(), ctxTimeout, gets)
		clients = append(clients, newClient(t, rdb, "product", keys, load, time.Minute, lockstep.WithRecorder(rec),
			lockstep.WithRedisTimeout(faultRedisTimeout), lockstep.WithLockTTL(time.Minute)))
	}
	var wg sync.WaitGroup
	for i := range gets {
		c := clients[i%2]
		id := strconv.Itoa(i)
		wg.Go(func() {
			start := time.Now()
			if v, err := c.Get(ctx, id); !errors.Is(err, lockstep.ErrRedisTimeout) {
				t.Errorf("Get(%q) = %q, %v during a freeze; want ErrRedisTimeout", id, v, err)
			}
			if took := time.Since(start); took > faultGetBound {
				t.Errorf("Get(%q) took %v, want < %v", id, took, faultGetBound)
			}
		})
	}
	wg.Wait()
	if ks := lockKeys(t, direct); len(ks) != 0 {
		t.Fatalf("locks taken during the freeze, before it ended: %v", ks)
	}
	fp.Heal()
	testenv.Eventually(t, 20*time.Second, "the queued SET NX to run", func() bool { return setCalls(t, direct) >= gets })
	testenv.Eventually(t, 20*time.Second, "no lock keys", func() bool { return len(lockKeys(t, direct)) == 0 })
	if n := loads.Load(); n != 0 {
		t.Errorf("loader called %d times, want 0 (every acquire timed out)", n)
	}
	t.Logf("%d SET NX ran after the freeze; every lock they took was released", setCalls(t, direct))
}

func lockKeys(t *testing.T, rdb *redis.Client) []string {
	t.Helper()
	keys, err := rdb.Keys(context.Background(), "lock:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// setCalls is the number of SET commands the server has run since CONFIG RESETSTAT.
func setCalls(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_set:calls="); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			return n
		}
	}
	return 0
}
