package testenv_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// proxiedRedis returns a client to the shared Redis through fp, with short timeouts and no retries so that a
// fault shows as one error.
func proxiedRedis(t *testing.T, fp *testenv.FaultProxy) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr: fp.Addr(), DialTimeout: 500 * time.Millisecond, ReadTimeout: 300 * time.Millisecond,
		WriteTimeout: 300 * time.Millisecond, MaxRetries: -1, PoolSize: 4,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// nilErr adapts f for testenv.EventuallyDiag: it holds when f returns nil; the diagnostic is f's last error.
func nilErr(f func() error) func() (bool, string) {
	return func() (bool, string) {
		if err := f(); err != nil {
			return false, err.Error()
		}
		return true, ""
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestFaultProxy(t *testing.T) {
	direct := testenv.Redis(t)
	p := testenv.Prefix(t, direct)
	ctx := context.Background()
	if err := direct.Set(ctx, p+"k", "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	get := func(c *redis.Client) error {
		v, err := c.Get(ctx, p+"k").Result()
		if err == nil && v != "v" {
			return errors.New("got " + v + ", want v")
		}
		return err
	}

	tests := []struct {
		name   string
		inject func(*testenv.FaultProxy)
		check  func(error) bool // the error a GET through the faulty link must give
	}{
		{"stall", (*testenv.FaultProxy).Stall, isTimeout},
		{"freeze", func(fp *testenv.FaultProxy) { fp.Freeze(time.Hour) }, isTimeout},
		{"latency", func(fp *testenv.FaultProxy) { fp.Latency(time.Second, 0) }, isTimeout},
		// A reset or a cut shows as a reset, an EOF or a refused dial, depending on whether the pooled connection
		// was seen closed before the GET was written; any error proves the fault (Cut's refusal of new dials is
		// checked by TestFaultProxyCutRestoreKeepsAddr).
		{"reset peers", (*testenv.FaultProxy).ResetPeers, func(err error) bool { return err != nil }},
		{"cut", (*testenv.FaultProxy).Cut, func(err error) bool { return err != nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fp := testenv.Proxy(t, testenv.RedisAddr(t))
			c := proxiedRedis(t, fp)
			if err := get(c); err != nil {
				t.Fatalf("GET through a healthy proxy: %v", err)
			}
			tt.inject(fp)
			if err := get(c); !tt.check(err) {
				t.Fatalf("GET through a %s link: got error %v (%T), want the fault's error", tt.name, err, err)
			}
			fp.Heal()
			testenv.EventuallyDiag(t, 10*time.Second, "GET after Heal", nilErr(func() error { return get(c) }))
		})
	}
}

// TestFaultProxyFreezeDeliversLate shows what Freeze is for: a write that timed out during the freeze still runs
// when the link heals.
func TestFaultProxyFreezeDeliversLate(t *testing.T) {
	direct := testenv.Redis(t)
	p := testenv.Prefix(t, direct)
	ctx := context.Background()
	fp := testenv.Proxy(t, testenv.RedisAddr(t))
	c := proxiedRedis(t, fp)
	// Open the connection first: a new go-redis connection's handshake would be frozen too, and the SET never sent.
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	fp.Freeze(time.Hour)
	if err := c.Set(ctx, p+"late", "1", time.Minute).Err(); !isTimeout(err) {
		t.Fatalf("SET through a frozen link: got %v, want a timeout", err)
	}
	if n := direct.Exists(ctx, p+"late").Val(); n != 0 {
		t.Fatalf("key written during the freeze: EXISTS = %d, want 0", n)
	}
	fp.Heal()
	testenv.Eventually(t, 10*time.Second, "the frozen SET runs after Heal", func() bool {
		return direct.Exists(ctx, p+"late").Val() == 1
	})
}

func TestFaultProxyCutRestoreKeepsAddr(t *testing.T) {
	fp := testenv.Proxy(t, testenv.RedisAddr(t))
	addr := fp.Addr()
	fp.Cut()
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatalf("dial %s after Cut: connected, want refused", addr)
	}
	fp.Restore()
	if fp.Addr() != addr {
		t.Fatalf("Addr after Restore = %s, want %s", fp.Addr(), addr)
	}
	c := proxiedRedis(t, fp)
	testenv.EventuallyDiag(t, 10*time.Second, "PING after Restore", nilErr(func() error { return c.Ping(context.Background()).Err() }))
}
