package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keepwarm/keepwarm/internal/backoff"
)

// Bounds of the reconnect back-off (see dialBackoff).
const (
	// ReconnectBackoffBase is the pause (before jitter) after the first failed dial of an address; it doubles
	// per consecutive failure.
	ReconnectBackoffBase = 250 * time.Millisecond
	// ReconnectBackoffMax is the longest pause between two dials of an address that keeps failing: PostgreSQL back
	// from an outage is used again within this long (refreshes, the change stream's visibility checks). One dial
	// per address per 5 s costs the server nothing.
	ReconnectBackoffMax = 5 * time.Second
)

// ErrReconnectBackoff is wrapped by the error of a connection attempt that was not dialled because the last
// dial of the address failed and its back-off pause has not ended. The error also wraps that last dial error.
var ErrReconnectBackoff = errors.New("postgres: reconnect back-off")

// dialBackoff wraps a pool's dial function so that, while PostgreSQL is down, the pool dials each address at
// most once per back-off pause (backoff.Delay from ReconnectBackoffBase up to ReconnectBackoffMax, jittered)
// however many refreshes, checks and readiness probes want a connection: the others fail at once with
// ErrReconnectBackoff. pgxpool itself dials on every Acquire that finds no idle connection, which made a daemon
// open about 25 connections per second against a PostgreSQL that was down. A successful dial resets the address;
// a dial cut short by its caller's context (shutdown) does not count as a failure.
type dialBackoff struct {
	dial pgconn.DialFunc
	now  func() time.Time
	rand func() float64

	mu    sync.Mutex
	addrs map[string]*dialState
}

type dialState struct {
	failures int
	until    time.Time
	lastErr  error
}

func newDialBackoff(dial pgconn.DialFunc) *dialBackoff {
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	return &dialBackoff{dial: dial, now: time.Now, rand: rand.Float64, addrs: map[string]*dialState{}}
}

// DialContext has the signature of pgconn.DialFunc.
func (b *dialBackoff) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	b.mu.Lock()
	st := b.addrs[addr]
	if st != nil && b.now().Before(st.until) {
		wait, last := st.until.Sub(b.now()), st.lastErr
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: not dialling %s for another %v after %d failed dials: %w", ErrReconnectBackoff,
			addr, wait.Round(time.Millisecond), st.failures, last)
	}
	b.mu.Unlock()
	conn, err := b.dial(ctx, network, addr)
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case err == nil:
		delete(b.addrs, addr)
	case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
		// cancelled by the caller (shutdown): says nothing about the server
	default:
		if st = b.addrs[addr]; st == nil {
			st = &dialState{}
			b.addrs[addr] = st
		}
		st.until = b.now().Add(backoff.Delay(st.failures, ReconnectBackoffBase, ReconnectBackoffMax, b.rand()))
		st.failures++
		st.lastErr = err
	}
	return conn, err
}
