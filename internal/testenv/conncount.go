package testenv

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// CountingDialer returns a go-redis Dialer that dials TCP and counts the connections in dials and the bytes
// read in read (either may be nil).
func CountingDialer(dials, read *atomic.Int64) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if dials != nil {
			dials.Add(1)
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil || read == nil {
			return c, err
		}
		return countingConn{c, read}, nil
	}
}

type countingConn struct {
	net.Conn
	read *atomic.Int64
}

func (c countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.read.Add(int64(n))
	return n, err
}

// HandshakeBytes measures what go-redis's connection handshake (HELLO 3, CLIENT SETINFO, ...) receives from the
// shared Redis, in bytes, so that a FaultProxy.CutReplies limit can count from its end whatever the versions of
// the two.
func HandshakeBytes(tb testing.TB) int {
	tb.Helper()
	var n atomic.Int64
	c := redis.NewClient(&redis.Options{Addr: RedisAddr(tb), Dialer: CountingDialer(nil, &n)})
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil {
		tb.Fatalf("ping: %v", err)
	}
	return int(n.Load()) - len("+PONG\r\n")
}
