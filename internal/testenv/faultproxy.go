package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// FaultProxy is a TCP proxy between the code under test and a real server (Redis, PostgreSQL) that injects
// network faults on demand: a stall, latency, connection resets, a cut. It is Shopify's toxiproxy v2
// (github.com/Shopify/toxiproxy/v2) run inside the test process, with no toxiproxy binary and no HTTP API: the
// test drives the proxy's toxic collection directly.
//
// Point the client under test at Addr instead of the server's own address. Faults apply to the connections
// already open and to the ones opened later, in both directions unless the method says otherwise, until Heal.
// The methods are safe for concurrent use; a failure to apply a fault fails the test (tb.Fatal), so call them
// from the test's goroutine.
type FaultProxy struct {
	tb       testing.TB
	proxy    *toxiproxy.Proxy
	addr     string
	upstream string
	n        atomic.Int64 // names the toxics
	mu       sync.Mutex   // serialises Cut and Restore
}

// Proxy starts an in-process toxiproxy listening on a free loopback port and forwarding to upstreamAddr
// ("host:port", e.g. "127.0.0.1:16379"). It checks that upstreamAddr answers a TCP dial, failing the test with a
// message saying how to start the local services when it does not, and stops the proxy (closing every proxied
// connection) on tb.Cleanup.
func Proxy(tb testing.TB, upstreamAddr string) *FaultProxy {
	tb.Helper()
	conn, err := net.DialTimeout("tcp", upstreamAddr, 3*time.Second)
	if err != nil {
		tb.Fatalf("fault proxy: upstream %s is not reachable (%v): "+howToStart, upstreamAddr, err,
			"KEEPWARM_REDIS_URL or KEEPWARM_POSTGRES_URL")
	}
	_ = conn.Close()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	name := strings.NewReplacer("/", "_", " ", "_").Replace(tb.Name()) + "_" + randHex(3)
	p := toxiproxy.NewProxy(server, name, "127.0.0.1:0", upstreamAddr)
	if err := server.Collection.Add(p, true); err != nil {
		tb.Fatalf("fault proxy: start proxy to %s: %v", upstreamAddr, err)
	}
	fp := &FaultProxy{tb: tb, proxy: p, addr: p.Listen, upstream: upstreamAddr}
	tb.Cleanup(func() { _ = server.Collection.Clear() })
	return fp
}

// RedisAddr returns the host:port of the shared Redis (KEEPWARM_REDIS_URL), for Proxy.
func RedisAddr(tb testing.TB) string {
	tb.Helper()
	return hostPort(tb, RedisURL())
}

// PostgresAddr returns the host:port of the shared PostgreSQL (KEEPWARM_POSTGRES_URL), for Proxy.
func PostgresAddr(tb testing.TB) string {
	tb.Helper()
	return hostPort(tb, PostgresURL())
}

func hostPort(tb testing.TB, url string) string {
	tb.Helper()
	rest, ok := strings.CutPrefix(url, "redis://")
	if !ok {
		rest, ok = strings.CutPrefix(url, "postgres://")
	}
	if !ok {
		rest, ok = strings.CutPrefix(url, "postgresql://")
	}
	if !ok {
		tb.Fatalf("fault proxy: %q is not a redis:// or postgres:// URL", url)
	}
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		rest = rest[:i]
	}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		rest = rest[i+1:]
	}
	if _, _, err := net.SplitHostPort(rest); err != nil {
		tb.Fatalf("fault proxy: no host:port in the URL (%v)", err) // the URL may hold a password: not printed
	}
	return rest
}

// Addr is the proxy's listen address, "127.0.0.1:port". It stays the same across Cut and Restore.
func (f *FaultProxy) Addr() string { return f.addr }

// Upstream is the address given to Proxy.
func (f *FaultProxy) Upstream() string { return f.upstream }

// Stall makes the link a black hole: bytes sent either way are dropped (toxiproxy's "timeout" toxic with timeout
// 0) and connections stay open, so a client's reads block until its own deadline. Commands sent during a stall
// never reach the server. Heal ends it; the data dropped meanwhile is lost, so a client must drop the connections
// that timed out.
func (f *FaultProxy) Stall() {
	f.tb.Helper()
	f.add("timeout", "upstream", map[string]any{"timeout": 0})
	f.add("timeout", "downstream", map[string]any{"timeout": 0})
}

// Freeze holds the bytes sent to the server, without losing them, for up to hold (a "latency" toxic on the
// upstream direction): as when the server process is paused (SIGSTOP, a long fork, a slow script), commands
// queue and run only when Heal (or the end of hold) lets them through, after the client may have given up. It is
// the fault behind orphaned locks: a SET NX that timed out still takes the lock when the server wakes. Only
// commands written on connections opened before the freeze are queued this way: a new connection's handshake
// (go-redis sends HELLO first) is held too, so its client gives up before sending any command. hold must be > 0;
// pass a duration longer than the test, e.g. time.Hour.
func (f *FaultProxy) Freeze(hold time.Duration) {
	f.tb.Helper()
	if hold <= 0 {
		f.tb.Fatalf("fault proxy: freeze: hold %v is not > 0", hold)
	}
	f.add("latency", "upstream", map[string]any{"latency": hold.Milliseconds()})
}

// Latency delays every chunk of bytes by d ± jitter in each direction (toxiproxy's "latency" toxic), so a round
// trip takes about 2d more. Data is never lost; Heal removes the delay and lets held data through at once.
func (f *FaultProxy) Latency(d, jitter time.Duration) {
	f.tb.Helper()
	if d < 0 || jitter < 0 {
		f.tb.Fatalf("fault proxy: latency: %v ± %v is negative", d, jitter)
	}
	for _, dir := range []string{"upstream", "downstream"} {
		f.add("latency", dir, map[string]any{"latency": d.Milliseconds(), "jitter": jitter.Milliseconds()})
	}
}

// ResetPeers makes every connection fail with a TCP RST (toxiproxy's "reset_peer" toxic, timeout 0) as soon as
// the client sends anything; new connections are accepted and reset the same way, as when the server restarts or
// a load balancer drops its flows. Heal ends it.
func (f *FaultProxy) ResetPeers() {
	f.tb.Helper()
	f.add("reset_peer", "upstream", map[string]any{"timeout": 0})
}

// CutReplies closes every connection once the server has sent it n bytes (toxiproxy's "limit_data" toxic on the
// downstream direction), and every new connection the same way: the command whose reply crosses the limit has run
// on the server, but its client sees the reply cut short and the connection gone, as after a reset between the
// two. A client that retries such a command (go-redis does, MaxRetries) sends it a second time. Count the
// handshake (go-redis's HELLO reply is a few hundred bytes) in n. Heal ends it.
func (f *FaultProxy) CutReplies(n int) {
	f.tb.Helper()
	if n <= 0 {
		f.tb.Fatalf("fault proxy: cut replies: %d bytes is not > 0", n)
	}
	f.add("limit_data", "downstream", map[string]any{"bytes": n})
}

// Cut disables the proxy: it closes every proxied connection and stops listening, so dials to Addr are refused,
// as when the server is down. Restore (or Heal) listens again on the same address.
func (f *FaultProxy) Cut() {
	f.tb.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.proxy.Stop()
}

// Restore undoes Cut: the proxy listens on Addr again. Toxics added before stay in place. It is a no-op when the
// proxy is not cut.
func (f *FaultProxy) Restore() {
	f.tb.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.proxy.Enabled {
		return
	}
	if err := f.proxy.Start(); err != nil && err != toxiproxy.ErrProxyAlreadyStarted {
		f.tb.Fatalf("fault proxy: restore %s: %v", f.addr, err)
	}
}

// Heal removes every fault: all toxics (held bytes are delivered, dropped bytes stay lost) and a Cut.
// Connections that a fault left broken stay broken; clients reconnect.
func (f *FaultProxy) Heal() {
	f.tb.Helper()
	f.proxy.Toxics.ResetToxics(context.Background())
	f.Restore()
}

// add adds one toxic of typ on stream ("upstream": client to server, "downstream": server to client) with the
// given attributes, at toxicity 1 (every connection).
func (f *FaultProxy) add(typ, stream string, attrs map[string]any) {
	f.tb.Helper()
	body, err := json.Marshal(map[string]any{
		"name":       fmt.Sprintf("%s_%s_%d", typ, stream, f.n.Add(1)),
		"type":       typ,
		"stream":     stream,
		"toxicity":   1.0,
		"attributes": attrs,
	})
	if err != nil {
		f.tb.Fatalf("fault proxy: encode toxic: %v", err)
	}
	if _, err := f.proxy.Toxics.AddToxicJson(strings.NewReader(string(body))); err != nil {
		f.tb.Fatalf("fault proxy: add %s toxic on %s: %v", typ, stream, err)
	}
}
