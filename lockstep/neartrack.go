package lockstep

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// nearInvalidateChannel is where Redis redirects invalidation messages for RESP2 connections.
const nearInvalidateChannel = "__redis__:invalidate"

// nearProbePrefix starts the name of the channel that only one tracker's dedicated connection subscribes to; the
// app's client publishes to it to learn whether the two are on the same server (nearTracker.onAppServer).
const nearProbePrefix = "__lockstep:near:probe:"

// errNotOnAppServer: the dedicated connection is subscribed on a server other than the one the app's client
// reaches (PUBLISH to the probe channel through the app's client had no receiver).
var errNotOnAppServer = errors.New("the invalidation connection is not on the server the app's client reaches (a failover, or a proxy or DNS name that moved)")

// nearTracker owns the dedicated invalidation connection of a near cache: a go-redis client of its own (RESP2,
// one connection) whose OnConnect hook turns broadcast tracking on, and a PubSub on __redis__:invalidate whose
// messages it applies to the store. The store is up only from the subscription's confirmation on a connection
// until that connection fails, lags or is replaced. run is its only long-lived goroutine, plus one heartbeat.
type nearTracker struct {
	store    *nearStore
	rdb      *redis.Client // the dedicated client; its connections go through dialHook and onConnect
	app      *redis.Client // the app's client, which publishes to probe
	probe    string        // nearProbePrefix + a token: subscribed by the dedicated connection alone
	prefix   string        // BCAST PREFIX; "" tracks every key
	maxLag   time.Duration
	log      *slog.Logger
	report   func(bytes int64) // NearRecorder.NearBytes, or a no-op
	appHook  func(ctx context.Context, cn *redis.Conn) error
	clientID atomic.Int64 // CLIENT ID of the connection while the store is up, else 0

	connMu  sync.Mutex // guards dials, connGen and connID, and orders the store's going up against a new dial
	dials   uint64     // connections started (DialHook)
	connGen uint64     // dials when the newest connection ran onConnect
	connID  int64      // that connection's CLIENT ID
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
	if opt.StreamingCredentialsProvider != nil {
		return nil, unsupported("rdb takes credentials from a streaming provider: go-redis re-authenticates live connections with AUTH, and Redis refuses AUTH on a subscribed RESP2 connection")
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

// newNearTracker builds the dedicated client from a copy of rdb's options: same address, database, credentials,
// TLS and Dialer (a Sentinel failover client's Dialer asks the Sentinels for the current master on every dial),
// but RESP2 (so that invalidations arrive as pub/sub messages), one connection, no client-side caching of
// go-redis's own, and lockstep's OnConnect (after the app's, if any).
func newNearTracker(rdb *redis.Client, store *nearStore, prefix string, maxLag time.Duration, log *slog.Logger, report func(int64)) *nearTracker {
	t := &nearTracker{store: store, app: rdb, probe: nearProbePrefix + NewToken(), prefix: prefix, maxLag: maxLag, log: log, report: report}
	opt := *rdb.Options()
	t.appHook = opt.OnConnect
	opt.OnConnect = t.onConnect
	opt.Protocol = 2
	opt.PoolSize, opt.MinIdleConns, opt.MaxIdleConns, opt.MaxActiveConns = 1, 0, 0, 0
	opt.DialerRetries = 1 // run retries with its own back-off
	opt.ClientSideCacheConfig, opt.ClientSideCache = nil, nil
	opt.Limiter = nil // the app's limiter is for the app's commands
	t.rdb = redis.NewClient(&opt)
	t.rdb.AddHook(t)
	return t
}

// DialHook makes nearTracker a redis.Hook of its dedicated client: every new connection, whether go-redis makes it
// after an error or run asks for it, first empties the store and marks it down, since invalidations sent while
// no connection was subscribed are lost.
func (t *nearTracker) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		t.connMu.Lock()
		t.dials++
		t.down()
		t.connMu.Unlock()
		return next(ctx, network, addr)
	}
}

// ProcessHook is redis.Hook's; commands pass through.
func (t *nearTracker) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

// ProcessPipelineHook is redis.Hook's; pipelines pass through.
func (t *nearTracker) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// onConnect runs on every new connection of the dedicated client, before go-redis subscribes it: CLIENT ID, then
// CLIENT TRACKING ON REDIRECT <that id> BCAST PREFIX <prefix> (the connection redirects to itself). It bumps the
// store's epoch, so no fill begun before this connection can be stored.
func (t *nearTracker) onConnect(ctx context.Context, cn *redis.Conn) error {
	if t.appHook != nil {
		if err := t.appHook(ctx, cn); err != nil {
			return err
		}
	}
	id, err := cn.ClientID(ctx).Result()
	if err != nil {
		return fmt.Errorf("client id: %w", err)
	}
	args := []any{"client", "tracking", "on", "redirect", id, "bcast"}
	if t.prefix != "" {
		args = append(args, "prefix", t.prefix)
	}
	if err := cn.Do(ctx, args...).Err(); err != nil {
		return fmt.Errorf("client tracking on (Redis 6 or later is needed): %w", err)
	}
	t.connMu.Lock()
	t.down()
	t.store.epoch.Add(1)
	t.connGen, t.connID = t.dials, id
	t.connMu.Unlock()
	return nil
}

// started is the number of connections started so far.
func (t *nearTracker) started() uint64 {
	t.connMu.Lock()
	defer t.connMu.Unlock()
	return t.dials
}

// subscribed puts the store up for the newest connection, unless a newer one has been started since it ran
// onConnect (the confirmation then comes from a connection that is being replaced).
func (t *nearTracker) subscribed() {
	t.connMu.Lock()
	defer t.connMu.Unlock()
	if t.connGen != t.dials || t.connID == 0 {
		return
	}
	t.clientID.Store(t.connID)
	t.store.up.Store(true)
}

// down empties the store and marks it down, unless it is down already.
func (t *nearTracker) down() {
	t.clientID.Store(0)
	if t.store.up.Load() {
		t.store.reset(false)
	}
}

// run keeps a subscription on __redis__:invalidate until stop is closed. Reads wait at most MaxLag (the heartbeat
// pings every MaxLag/2). Any error marks the store down. go-redis replaces the connection by itself after a
// network error (the DialHook then runs); after anything else (a timeout, which go-redis keeps the connection for;
// a reply it cannot parse, such as the null payload of a flush) run closes the PubSub and subscribes anew, so the
// store is only up again after a new connection's confirmation. While no connection can be made, run retries
// after 50ms, doubling to 1s.
func (t *nearTracker) run(stop <-chan struct{}) {
	const minBackoff, maxBackoff = 50 * time.Millisecond, time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hb := &nearHeartbeat{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t.heartbeat(ctx, cancel, stop, hb)
	}()
	defer func() {
		hb.close()
		wg.Wait()
		t.down()
		t.report(t.store.bytes.Load())
		_ = t.rdb.Close()
	}()
	backoff := minBackoff
	warned := false // errNotOnAppServer was logged since the store was last up
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	for {
		ps := t.rdb.Subscribe(ctx, nearInvalidateChannel, t.probe) // an error here comes back from ReceiveTimeout
		if !hb.set(ps) {
			return
		}
		for {
			dials := t.started()
			msg, err := ps.ReceiveTimeout(ctx, t.maxLag)
			if err == nil {
				err = t.apply(ctx, msg)
			}
			if err == nil {
				backoff = minBackoff
				warned = warned && !t.store.up.Load()
				continue
			}
			wasUp := t.store.up.Load()
			t.down()
			t.report(t.store.bytes.Load())
			if ctx.Err() != nil {
				return
			}
			switch {
			case wasUp:
				t.log.Warn("lockstep: near cache invalidation subscription interrupted (a lost or late connection, or a flush); bypassing the near cache until it is back", "error", err)
			case errors.Is(err, errNotOnAppServer) && !warned:
				warned = true // once until the store is up again: a client that reads from replicas would repeat it every second
				t.log.Warn("lockstep: near cache bypassed: its invalidation connection keeps reaching another server than the app's client (with Sentinel, is the client ReplicaOnly?)", "error", err)
				fallthrough
			default:
				t.log.Debug("lockstep: near cache invalidation connection: still down", "error", err, "retry_in", backoff)
				timer.Reset(backoff)
				select {
				case <-ctx.Done():
					return
				case <-timer.C:
				}
				backoff = min(2*backoff, maxBackoff)
			}
			if t.started() == dials {
				break // go-redis keeps this connection: replace it
			}
		}
		_ = ps.Close()
	}
}

// apply handles one message of the subscription: the confirmation of a new connection's subscription (the store
// goes up if that connection is on the app's server, else apply returns the error of onAppServer), an
// invalidation of keys, or a heartbeat reply (ignored, like the probes).
func (t *nearTracker) apply(ctx context.Context, msg any) error {
	switch m := msg.(type) {
	case *redis.Subscription:
		if m.Kind == "subscribe" && m.Channel == nearInvalidateChannel {
			// SUBSCRIBE names both channels in one command, so the probe channel is subscribed by now.
			if err := t.onAppServer(ctx); err != nil {
				return err
			}
			t.subscribed()
			t.report(t.store.bytes.Load())
		}
	case *redis.Message:
		if m.Channel != nearInvalidateChannel {
			return nil
		}
		if len(m.PayloadSlice) == 0 {
			t.store.reset(true) // no key named: treat it as a flush
			return nil
		}
		for _, k := range m.PayloadSlice {
			t.store.invalidate(k)
		}
	}
	return nil
}

// onAppServer says whether the dedicated connection is subscribed on the server that the app's client reaches
// now: the app's client PUBLISHes an empty message to the probe channel, which no one but this tracker's
// connection subscribes to, and Redis answers with the number of receivers on that server. 0 is
// errNotOnAppServer: after a Sentinel failover, or when a proxy or a DNS name moved the app's connections, the
// dedicated one can still be subscribed on the old server and would not hear of changes made on the new one. The
// PUBLISH goes through the app's client and its hooks, and is bounded by MaxLag; its error (the server is down)
// is returned as it is.
func (t *nearTracker) onAppServer(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, t.maxLag)
	defer cancel()
	n, err := t.app.Publish(ctx, t.probe, "").Result()
	switch {
	case err != nil:
		return fmt.Errorf("probe of the app's server (PUBLISH %s): %w", t.probe, err)
	case n == 0:
		return errNotOnAppServer
	}
	return nil
}

// nearHeartbeat is the PubSub the heartbeat pings. mu guards ps and closed.
type nearHeartbeat struct {
	mu     sync.Mutex
	ps     *redis.PubSub
	closed bool
}

// set makes ps the one to ping; false (and ps closed) once close has run.
func (h *nearHeartbeat) set(ps *redis.PubSub) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		_ = ps.Close()
		return false
	}
	h.ps = ps
	return true
}

func (h *nearHeartbeat) get() *redis.PubSub {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ps
}

// close closes the current PubSub (which ends a ReceiveTimeout blocked on it) and every later one.
func (h *nearHeartbeat) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	if h.ps != nil {
		_ = h.ps.Close()
	}
}

// heartbeat pings the subscribed connection every MaxLag/2 while the store is up (Redis answers in order, so a
// pong proves every earlier invalidation has arrived), and checks that it is still on the app's server
// (onAppServer): when it is not, the store goes down at once and the connection is closed, so that run makes a
// new one (through the Dialer, which after a Sentinel failover reaches the new master). It runs until stop is
// closed, then closes the PubSub.
func (t *nearTracker) heartbeat(ctx context.Context, cancel context.CancelFunc, stop <-chan struct{}, hb *nearHeartbeat) {
	defer cancel()
	tick := time.NewTicker(t.maxLag / 2)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			cancel() // first: run sees its ReceiveTimeout fail as the end, not as a lost connection
			hb.close()
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		t.report(t.store.bytes.Load())
		if !t.store.up.Load() {
			continue // no connection to ping; pinging would dial one outside run's back-off
		}
		ps := hb.get()
		if ps == nil {
			continue
		}
		if err := ps.Ping(ctx); err != nil && !errors.Is(err, context.Canceled) {
			t.log.Debug("lockstep: near cache heartbeat", "error", err)
		}
		if err := t.onAppServer(ctx); errors.Is(err, errNotOnAppServer) {
			t.down()
			t.log.Warn("lockstep: near cache bypassed until its invalidation connection is made again", "error", err)
			_ = ps.Close() // run's ReceiveTimeout fails, and run subscribes on a new connection
		}
	}
}
