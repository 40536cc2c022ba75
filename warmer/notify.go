package warmer

import (
	"context"
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
	if res, err := w.rdb.ConfigGet(ctx, "notify-keyspace-events").Result(); err == nil {
		flags := res["notify-keyspace-events"]
		if !strings.Contains(flags, "E") || !(strings.Contains(flags, "A") ||
			(strings.ContainsAny(flags, "x") && strings.ContainsAny(flags, "g"))) {
			w.log.Info("keyspace notifications are off in Redis; PTTL reconciliation alone tracks expiries",
				"notify_keyspace_events", flags)
		}
	} else if ctx.Err() == nil {
		// Not fatal (reconciliation is the ground truth), but say so: a denied CONFIG GET (an ACL without
		// +config|get) would otherwise hide that notifications may be off.
		w.log.Warn("cannot read notify-keyspace-events; subscribing anyway, PTTL reconciliation tracks expiries either way",
			"error", err)
	}
	patterns := make([]string, len(notifyEvents))
	for i, ev := range notifyEvents {
		patterns[i] = "__keyevent@" + strconv.Itoa(w.cfg.DB) + "__:" + ev
	}
	subscribe := func(c redis.UniversalClient) {
		ps := c.Subscribe(ctx, patterns...)
		defer ps.Close()
		ch := ps.Channel()
		for {
			select {
			case <-ctx.Done():
				return
			case msg, ok := <-ch:
				if !ok {
					return
				}
				w.onEvent(msg.Channel[strings.LastIndexByte(msg.Channel, ':')+1:], msg.Payload)
			}
		}
	}
	if cc, ok := w.rdb.(*redis.ClusterClient); ok {
		var wg sync.WaitGroup
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
	subscribe(w.rdb)
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
			h.needPTTL = true
			k.adopt = append(k.adopt, h)
		}
	case "expired", "evicted", "del":
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
