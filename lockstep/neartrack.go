package lockstep

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// nearInvalidateChannel is where Redis redirects invalidation messages for RESP2 connections.
const nearInvalidateChannel = "__redis__:invalidate"

// nearTracker owns the dedicated invalidation connection of a near cache: it dials, turns broadcast tracking on,
// applies invalidations to the store, and empties the store and marks it down whenever the connection is lost or
// late. run is its only long-lived goroutine (plus one heartbeat writer per connection).
type nearTracker struct {
	store    *nearStore
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	network  string
	addr     string
	user     string
	pass     string
	prefix   string // BCAST PREFIX; "" tracks every key
	maxLag   time.Duration
	log      *slog.Logger
	report   func(bytes int64) // NearRecorder.NearBytes, or a no-op
	clientID atomic.Int64      // CLIENT ID of the connection while it is up, else 0
}

// checkNear says why the near cache cannot serve rdb, or returns the *redis.Client to build it on.
func checkNear(rdb RedisClient, cfg *config) (*redis.Client, error) {
	unsupported := func(why string) error { return fmt.Errorf("%w: %s", ErrNearUnsupported, why) }
	if cfg.xfetchBeta > 0 {
		return nil, unsupported("with WithXFetch: XFetch decides on reads that reach Redis, and near hits would hide them")
	}
	c, ok := rdb.(*redis.Client)
	if !ok {
		return nil, unsupported(fmt.Sprintf("rdb is a %T, not a *redis.Client: tracking is per Redis node (a Cluster or a Ring would need one tracking connection per node)", rdb))
	}
	opt := c.Options()
	switch {
	case opt.Addr == "FailoverClient":
		return nil, unsupported("rdb is a Sentinel failover client: the tracking connection would not follow a failover")
	case opt.CredentialsProvider != nil || opt.CredentialsProviderContext != nil || opt.StreamingCredentialsProvider != nil:
		return nil, unsupported("rdb takes credentials from a provider: the tracking connection authenticates with Options.Username and Password only")
	case opt.Dialer == nil:
		return nil, unsupported("rdb's options have no Dialer (not made by redis.NewClient)")
	}
	return c, nil
}

// literalPrefix is the text of t before its first placeholder: every key t makes starts with it.
func literalPrefix(t Template) string {
	var b strings.Builder
	for _, p := range t.parts {
		if p.ph != "" {
			break
		}
		b.WriteString(p.lit)
	}
	return b.String()
}

func newNearTracker(rdb *redis.Client, store *nearStore, prefix string, maxLag time.Duration, log *slog.Logger, report func(int64)) *nearTracker {
	opt := rdb.Options()
	return &nearTracker{
		store:   store,
		dial:    opt.Dialer,
		network: opt.Network,
		addr:    opt.Addr,
		user:    opt.Username,
		pass:    opt.Password,
		prefix:  prefix,
		maxLag:  maxLag,
		log:     log,
		report:  report,
	}
}

// run keeps the invalidation connection up until stop is closed, redialling with a back-off (50ms doubling to
// 1s, back to 50ms after a connection that was up).
func (t *nearTracker) run(stop <-chan struct{}) {
	const minBackoff, maxBackoff = 50 * time.Millisecond, time.Second
	backoff := minBackoff
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	for {
		wasUp, err := t.session(stop)
		t.report(t.store.bytes.Load())
		select {
		case <-stop:
			return
		default:
		}
		if wasUp {
			backoff = minBackoff
		}
		if wasUp {
			t.log.Warn("lockstep: near cache invalidation connection lost; bypassing the near cache", "error", err, "retry_in", backoff)
		} else {
			t.log.Debug("lockstep: near cache invalidation connection: still down", "error", err, "retry_in", backoff)
		}
		timer.Reset(backoff)
		select {
		case <-stop:
			return
		case <-timer.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// session dials, subscribes and applies invalidations until the connection fails, lags or stop is closed. The
// store is up only while a session is subscribed; it is emptied and marked down before session returns.
func (t *nearTracker) session(stop <-chan struct{}) (wasUp bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), max(t.maxLag, time.Second))
	go func() {
		select {
		case <-stop:
		case <-ctx.Done():
		}
		cancel()
	}()
	conn, err := t.dial(ctx, t.network, t.addr)
	cancel()
	if err != nil {
		return false, fmt.Errorf("dial %s: %w", t.addr, err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		if wasUp {
			t.store.reset(false) // first: nothing more is served from memory once the connection has failed
		}
		t.clientID.Store(0)
		close(done)
		_ = conn.Close()
		wg.Wait()
	}()
	wg.Add(1)
	go func() { // closing the connection ends a read blocked in this session
		defer wg.Done()
		select {
		case <-stop:
			_ = conn.Close()
		case <-done:
		}
	}()
	r := bufio.NewReader(conn)
	_ = conn.SetDeadline(time.Now().Add(max(t.maxLag, time.Second)))
	id, err := t.handshake(conn, r)
	if err != nil {
		return false, err
	}
	_ = conn.SetWriteDeadline(time.Time{})
	t.clientID.Store(id)
	t.store.up.Store(true)
	wasUp = true
	wg.Add(1)
	go func() { // heartbeat: a PONG on this connection proves every earlier invalidation has arrived
		defer wg.Done()
		tick := time.NewTicker(t.maxLag / 2)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			t.report(t.store.bytes.Load())
			_ = conn.SetWriteDeadline(time.Now().Add(t.maxLag))
			if _, err := conn.Write(respCommand("PING")); err != nil {
				_ = conn.Close()
				return
			}
		}
	}()
	for {
		_ = conn.SetReadDeadline(time.Now().Add(t.maxLag))
		v, err := respRead(r)
		if err != nil {
			return true, fmt.Errorf("read invalidations: %w", err)
		}
		t.apply(v)
	}
}

// handshake authenticates, turns broadcast tracking on with this connection as its own redirect target, and
// subscribes to the invalidation channel. It returns the connection's CLIENT ID.
func (t *nearTracker) handshake(conn net.Conn, r *bufio.Reader) (int64, error) {
	var cmds [][]byte
	if t.pass != "" {
		if t.user != "" {
			cmds = append(cmds, respCommand("AUTH", t.user, t.pass))
		} else {
			cmds = append(cmds, respCommand("AUTH", t.pass))
		}
	}
	cmds = append(cmds, respCommand("CLIENT", "ID"))
	for _, c := range cmds {
		if _, err := conn.Write(c); err != nil {
			return 0, fmt.Errorf("handshake: %w", err)
		}
	}
	var id int64
	for range cmds {
		v, err := respRead(r)
		if err != nil {
			return 0, fmt.Errorf("handshake: %w", err)
		}
		if n, ok := v.(int64); ok {
			id = n
		}
	}
	if id == 0 {
		return 0, errors.New("handshake: CLIENT ID gave no id")
	}
	track := []string{"CLIENT", "TRACKING", "ON", "REDIRECT", strconv.FormatInt(id, 10), "BCAST"}
	if t.prefix != "" {
		track = append(track, "PREFIX", t.prefix)
	}
	if _, err := conn.Write(append(respCommand(track...), respCommand("SUBSCRIBE", nearInvalidateChannel)...)); err != nil {
		return 0, fmt.Errorf("handshake: %w", err)
	}
	if _, err := respRead(r); err != nil {
		return 0, fmt.Errorf("client tracking on (Redis 6 or later is needed): %w", err)
	}
	v, err := respRead(r)
	if err != nil {
		return 0, fmt.Errorf("subscribe %s: %w", nearInvalidateChannel, err)
	}
	if a, ok := v.([]any); !ok || len(a) != 3 || a[0] != "subscribe" {
		return 0, fmt.Errorf("subscribe %s: unexpected reply %v", nearInvalidateChannel, v)
	}
	return id, nil
}

// apply handles one message of the subscribed connection: an invalidation of keys, a flush (a null list), or a
// heartbeat reply.
func (t *nearTracker) apply(v any) {
	a, ok := v.([]any)
	if !ok || len(a) != 3 || a[0] != "message" || a[1] != nearInvalidateChannel {
		return // "pong", or a reply nobody waits for
	}
	keys, ok := a[2].([]any)
	if !ok {
		t.store.reset(true) // null: FLUSHDB, FLUSHALL, or the server's own tracking-table eviction
		return
	}
	for _, k := range keys {
		if s, ok := k.(string); ok {
			t.store.invalidate(s)
		}
	}
}

// respCommand encodes a command as a RESP array of bulk strings.
func respCommand(args ...string) []byte {
	b := []byte("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(a)), 10)
		b = append(b, "\r\n"...)
		b = append(b, a...)
		b = append(b, "\r\n"...)
	}
	return b
}

// respError is an error reply.
type respError string

func (e respError) Error() string { return string(e) }

// respRead reads one RESP2 value: a string (simple or bulk), an int64, a []any, nil for a null. An error reply
// is returned as a respError.
func respRead(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("bad RESP line %q", line)
	}
	body := line[1 : len(line)-2]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return nil, respError(body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		a := make([]any, n)
		for i := range a {
			if a[i], err = respRead(r); err != nil {
				return nil, err
			}
		}
		return a, nil
	}
	return nil, fmt.Errorf("bad RESP type %q", line[0])
}
