package warmer

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/redis/go-redis/v9"
)

// pttlChunk is how many PTTLs go in one pipeline.
const pttlChunk = 1000

// expiryTolerance absorbs the difference between the daemon's conservative expiry estimate (taken before the
// publish was sent) and Redis's own clock.
const expiryTolerance = 250 * time.Millisecond

// PTTL replies with special meanings.
const (
	pttlGone       = time.Duration(-2) // the key does not exist (go-redis returns the raw -2)
	pttlPersistent = time.Duration(-1) // the key has no TTL (go-redis returns the raw -1)
)

// pttls reads the PTTL of each id's cache key, pipelined in chunks. A nil slice means Redis failed.
func (k *keyspace) pttls(ctx context.Context, keys *lockstep.Keys, ids []string) ([]time.Duration, error) {
	out := make([]time.Duration, len(ids))
	for start := 0; start < len(ids); start += pttlChunk {
		end := min(start+pttlChunk, len(ids))
		pipe := k.w.rdb.Pipeline()
		cmds := make([]*redis.DurationCmd, end-start)
		for i, id := range ids[start:end] {
			ks, err := keys.For(id)
			if err != nil {
				cmds[i] = nil
				continue
			}
			cmds[i] = pipe.PTTL(ctx, ks.Cache)
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		for i, c := range cmds {
			if c == nil {
				out[start+i] = pttlGone
				continue
			}
			out[start+i] = c.Val()
		}
	}
	return out, nil
}

// learnExpiries reads the PTTL of newly hot keys (and of keys an app wrote, learnt from notifications) and
// schedules them: a missing key is due now, a key without TTL is reported and left alone.
func (k *keyspace) learnExpiries(ctx context.Context) {
	k.mu.Lock()
	var hs []*hotState
	for _, h := range k.adopt {
		if h.e.hot == h && h.needPTTL && !h.inflight {
			hs = append(hs, h)
		}
	}
	k.adopt = k.adopt[:0]
	k.mu.Unlock()
	if !k.readPTTLs(ctx, hs, "read PTTL of new hot keys", false) {
		k.mu.Lock()
		k.adopt = append(k.adopt, hs...) // try again on the next pass
		k.mu.Unlock()
	}
}

// readPTTLs reads the PTTL of hs (pipelined) and folds each reading into its key's state and schedule, skipping
// keys that stopped being hot or went in flight meanwhile. It reports false when Redis failed (logged once per
// outage as what).
func (k *keyspace) readPTTLs(ctx context.Context, hs []*hotState, what string, reconciling bool) bool {
	if len(hs) == 0 {
		return true
	}
	ids := make([]string, len(hs))
	for i, h := range hs {
		ids[i] = h.id
	}
	k.mu.Lock()
	keys := k.cfg.Keys
	k.mu.Unlock()
	now := k.w.now()
	epoch := k.w.notify.epoch.Load() // a reading confirms an own write only if no notification was missed since
	ttls, err := k.pttls(ctx, keys, ids)
	if err != nil {
		k.redisError(ctx, what, err)
		return false
	}
	k.redisOK()
	k.mu.Lock()
	defer k.mu.Unlock()
	for i, h := range hs {
		if h.e.hot != h || h.inflight {
			if h.e.hot == h && h.cidx < 0 {
				k.scheduleCheckLocked(h, now) // its refresh settles it; keep it in the check queue meanwhile
			}
			continue
		}
		h.needPTTL = false
		prev := h.expiry
		k.applyPTTLLocked(h, ttls[i], now, reconciling)
		if h.ownWrite && ttls[i] > 0 && absDur(h.expiry.Sub(prev)) <= expiryTolerance {
			h.notifyEpoch = epoch // the daemon's own value, confirmed: trusted again while notifications stay healthy
		} else {
			h.ownWrite = false
		}
		k.scheduleCheckLocked(h, now)
	}
	return true
}

// applyPTTLLocked folds a PTTL reading taken at now into h's state and schedule. reconciling marks a reading of
// a key the daemon was already watching, where "gone" may be an SLO miss.
func (k *keyspace) applyPTTLLocked(h *hotState, pttl time.Duration, now time.Time, reconciling bool) {
	switch {
	case pttl == pttlPersistent:
		if !h.persistent {
			k.log.Warn("hot key has no TTL; keepwarm will not overwrite it", "id", h.id)
		}
		h.persistent = true
		k.q.remove(h)
		k.gaugesLocked()
	case pttl < 0: // gone
		h.persistent = false
		if reconciling {
			k.noteGoneLocked(h, now)
		}
		h.expiry = time.Time{}
		k.scheduleLocked(h)
	default:
		h.persistent = false
		exp := now.Add(pttl)
		if h.expiry.IsZero() || absDur(exp.Sub(h.expiry)) > expiryTolerance || h.idx < 0 {
			// New information (a newly hot key, or one an app rewrote): was there still time to refresh it?
			h.shortNotice = pttl < k.leadLocked(h)
			h.expiry = exp
			k.scheduleLocked(h)
		}
	}
}

// noteGoneLocked counts a hot key found missing: an SLO miss if its expiry had passed without a refresh, else a
// key deleted or evicted early. Each expiry counts once.
func (k *keyspace) noteGoneLocked(h *hotState, now time.Time) {
	if h.counted || h.absent || h.expiry.IsZero() {
		return
	}
	h.counted = true
	if h.shortNotice {
		// The key became hot (or an app rewrote it) less than one lead before it expired: the daemon never had
		// the time to refresh it, so this is not counted against the SLO.
		k.w.m.lateNotice.WithLabelValues(k.cfg.Name).Inc()
		return
	}
	if !now.Before(h.expiry.Add(-expiryTolerance)) {
		k.w.m.hotExpired.WithLabelValues(k.cfg.Name).Inc()
		k.hotExpired.Add(1)
		k.log.Warn("hot key expired before its refresh", "id", h.id, "expired_ago", now.Sub(h.expiry))
		return
	}
	k.w.m.vanished.WithLabelValues(k.cfg.Name).Inc()
	k.noteVanishedLocked(now)
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// redisError logs a Redis failure once per outage of this keyspace, not once per key or per pass.
func (k *keyspace) redisError(ctx context.Context, what string, err error) {
	if ctx.Err() != nil {
		return
	}
	k.mu.Lock()
	first := k.redis.fail(k.w.now())
	k.mu.Unlock()
	if first {
		k.log.Error("redis failing; will keep retrying", "op", what, "error", err)
	}
}

func (k *keyspace) redisOK() {
	k.mu.Lock()
	ends, n := k.redis.ok(k.w.now())
	k.mu.Unlock()
	if ends {
		k.log.Info("redis recovered", "failures", n)
	}
}

// Keyspace-notification events the warmer listens to.
var notifyEvents = []string{"expired", "evicted", "del", "set"}

// listen subscribes to keyevent notifications for early notice of expiries, deletions, evictions and writes by
// apps. It needs notify-keyspace-events to include E plus x, e, g and $ (or A); it says in the log when they are
// off. In a Redis Cluster every master publishes only its own keys' events, so it subscribes on each master.
func (w *Warmer) listen(ctx context.Context) {
	patterns := make([]string, len(notifyEvents))
	for i, ev := range notifyEvents {
		patterns[i] = "__keyevent@" + strconv.Itoa(w.cfg.DB) + "__:" + ev
	}
	subscribe := func(c redis.UniversalClient) {
		w.subscribe(ctx, c, patterns)
	}
	if cc, ok := w.rdb.(*redis.ClusterClient); ok {
		var wg sync.WaitGroup
		masters := 0
		_ = cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error {
			masters++ // counted first, so that health waits for every master's subscription
			return nil
		})
		w.notify.setWant(masters)
		err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
			wg.Add(1)
			go func() {
				defer wg.Done()
				subscribe(c)
			}()
			return nil
		})
		if err != nil {
			w.log.Warn("keyspace notifications: cannot reach cluster masters", "error", err)
		}
		wg.Wait()
		return
	}
	w.notify.setWant(1)
	subscribe(w.rdb)
}

// checkNotifyFlags reads notify-keyspace-events and records whether it has the flags the warmer needs. Called
// at every (re)subscription, since a Redis restart resets the setting.
func (w *Warmer) checkNotifyFlags(ctx context.Context, c redis.UniversalClient) {
	res, err := c.ConfigGet(ctx, "notify-keyspace-events").Result()
	if err != nil {
		if ctx.Err() == nil {
			// Not fatal (reconciliation is the ground truth), but say so: a denied CONFIG GET (an ACL without
			// +config|get) would otherwise hide that notifications may be off. Unconfirmed, they are not trusted.
			w.log.Warn("cannot read notify-keyspace-events; subscribing anyway, PTTL reconciliation tracks expiries either way",
				"error", err)
		}
		w.notify.setFlags(false)
		return
	}
	flags := res["notify-keyspace-events"]
	ok := strings.Contains(flags, "E") && (strings.Contains(flags, "A") ||
		(strings.ContainsAny(flags, "x") && strings.ContainsAny(flags, "g")))
	if !ok {
		w.log.Info("keyspace notifications are off in Redis; PTTL reconciliation alone tracks expiries",
			"notify_keyspace_events", flags)
	}
	w.notify.setFlags(ok)
}

// notifyPing is how long a subscription may stay silent before it is pinged; one more silent period after the
// ping means the connection is dead: the subscription counts as lost and is made again.
const notifyPing = 5 * time.Second

// subscribe runs one subscription to patterns on c until ctx ends, feeding events to onEvent and telling
// w.notify when it is confirmed (every SUBSCRIBE reply) and when it is lost (an error or a silent connection),
// so that the reconciliation knows when events may have been missed.
func (w *Warmer) subscribe(ctx context.Context, c redis.UniversalClient, patterns []string) {
	for ctx.Err() == nil {
		ps := c.Subscribe(ctx, patterns...)
		up, pinged := false, false
		lost := func() {
			if up {
				w.notify.lost()
				up = false
			}
		}
		for ctx.Err() == nil {
			msg, err := ps.ReceiveTimeout(ctx, notifyPing)
			if err != nil {
				var ne interface{ Timeout() bool }
				if errors.As(err, &ne) && ne.Timeout() && !pinged && ctx.Err() == nil {
					pinged = true
					_ = ps.Ping(ctx)
					continue
				}
				lost()
				break // a fresh subscription below (go-redis would reconnect too, but not after a silent hang)
			}
			pinged = false
			switch m := msg.(type) {
			case *redis.Subscription:
				if m.Kind == "subscribe" && m.Count == len(patterns) && !up {
					w.checkNotifyFlags(ctx, c)
					w.notify.subscribed()
					up = true
				}
			case *redis.Message:
				w.onEvent(m.Channel[strings.LastIndexByte(m.Channel, ':')+1:], m.Payload)
			}
		}
		lost()
		ps.Close()
		if ctx.Err() == nil {
			t := time.NewTimer(time.Second)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}
}

// onEvent handles one keyevent notification for key.
func (w *Warmer) onEvent(event, key string) {
	w.mu.Lock()
	spaces := make([]*keyspace, 0, len(w.spaces))
	for _, k := range w.spaces {
		spaces = append(spaces, k)
	}
	w.mu.Unlock()
	for _, k := range spaces {
		if k.onEvent(event, key) {
			return
		}
	}
}

// onEvent reports whether key belongs to this keyspace.
func (k *keyspace) onEvent(event, key string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	m := k.match
	if m == nil {
		return false
	}
	id, ok := m.id(key)
	if !ok {
		return false
	}
	h := k.hotSet[id]
	if h == nil || h.inflight || h.persistent {
		return true
	}
	now := k.w.now()
	switch event {
	case "set":
		// An app (or the daemon itself, just now) wrote the key: learn the new expiry.
		if now.Sub(h.lastRefresh) > time.Second {
			h.ownWrite = false
			h.needPTTL = true
			k.adopt = append(k.adopt, h)
		}
	case "expired", "evicted", "del":
		if event == "evicted" {
			k.w.m.ev.evicted.WithLabelValues(k.name).Inc()
		}
		h.ownWrite = false
		if h.absent {
			return true
		}
		if event == "expired" && !h.expiry.IsZero() {
			h.expiry = minTime(h.expiry, now)
		}
		k.noteGoneLocked(h, now)
		h.expiry = time.Time{}
		k.scheduleLocked(h)
	}
	k.poke()
	return true
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
