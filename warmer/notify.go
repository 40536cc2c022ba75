package warmer

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

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
		// An app (or the daemon itself, just now) wrote the key: learn the new expiry. The first "set" after
		// the daemon's own write, within ownSetWindow, is taken as that write's own notification, however late
		// it arrives (on a loaded machine it can take seconds).
		if now.Before(h.ownSetUntil) {
			h.ownSetUntil = time.Time{}
			break
		}
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
		if h.missing {
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
