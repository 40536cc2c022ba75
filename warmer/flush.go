package warmer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/lockstep"
)

// A flush of the database (FLUSHDB, FLUSHALL, SWAPDB, a restart without persistence, a replica's full resync
// that replaced its data set) empties every key at once and publishes no per-key event, so neither
// notifications nor a trusted key's five-minute re-check would notice it for minutes. The warmer keeps a canary
// key of its own on each node and rewrites it every FlushCheckInterval with `SET canary 1 PX ttl GET`: the GET
// returning nil means the key was gone, so the database was flushed (or the process stalled for longer than the
// canary's TTL; either way every hot key's expiry is in doubt). Then every hot key it owns is re-read at once
// (rereadAll): each one found missing is an SLO miss (the flush is counted, not excused), and every key is
// refreshed within its next dispatch.

// DefaultFlushCheckInterval is how often the flush canary is rewritten (Config.FlushCheckInterval): a flush is
// noticed within this long, at the cost of one command per interval per Redis master.
const DefaultFlushCheckInterval = 250 * time.Millisecond

// canaryTTL is the canary key's TTL: it outlives this process by at most this long.
const canaryTTL = 30 * time.Second

// canaries finds one canary key per Redis master: a Cluster's keys live on the master that owns their hash slot,
// so a FLUSHDB on one master is seen only by a canary in that master's slots. In single and Sentinel mode there is
// one canary.
type canaries struct {
	prefix string          // "keepwarm:canary:<token>"
	keys   map[int]string  // slot range start (or 0 outside a Cluster) → canary key
	seen   map[string]bool // canaries written at least once since they were chosen
}

// refresh picks the canary keys for the current topology: in a Cluster, one key per master, found by asking
// CLUSTER KEYSLOT for candidate hash tags until each master's first slot range has one.
func (c *canaries) refresh(ctx context.Context, rdb redis.UniversalClient) error {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		if c.keys == nil {
			c.keys = map[int]string{0: c.prefix}
		}
		return nil
	}
	slots, err := cc.ClusterSlots(ctx).Result() //lint:ignore SA1019 CLUSTER SHARDS is Redis 7.0+; the daemon supports 6.2, whose only map is CLUSTER SLOTS
	if err != nil {
		return fmt.Errorf("read cluster slots: %w", err)
	}
	masters := map[string]redis.ClusterSlot{} // master address → its first slot range
	for _, s := range slots {
		if len(s.Nodes) == 0 {
			continue
		}
		if cur, ok := masters[s.Nodes[0].Addr]; !ok || s.Start < cur.Start {
			masters[s.Nodes[0].Addr] = s
		}
	}
	keys := map[int]string{}
	for _, s := range masters {
		if k, ok := c.keys[s.Start]; ok {
			if slot, err := cc.ClusterKeySlot(ctx, k).Result(); err == nil && int(slot) >= s.Start && int(slot) <= s.End {
				keys[s.Start] = k
				continue
			}
		}
		for n := 0; n < 4096; n++ {
			k := fmt.Sprintf("%s:{c%d-%d}", c.prefix, s.Start, n)
			slot, err := cc.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				return fmt.Errorf("cluster keyslot: %w", err)
			}
			if int(slot) >= s.Start && int(slot) <= s.End {
				keys[s.Start] = k
				break
			}
		}
	}
	c.keys = keys
	return nil
}

// check rewrites every canary and reports whether one of them, written before, was gone. refused is the first
// canary's SET that Redis refused as a write (OOM, READONLY, NOPERM: see refusals.go), allOK whether every
// canary's SET succeeded. A canary whose SET was refused has its TTL renewed with PEXPIRE instead, which Redis
// does not refuse for memory: without it, an OOM episode longer than canaryTTL would let the canary expire and
// its first SET after the episode would report a flush that never happened. A real flush during the episode
// frees memory, so the next SET is taken and finds the canary gone, as it would without the episode.
func (c *canaries) check(ctx context.Context, rdb redis.UniversalClient) (flushed []string, refused error, allOK bool, err error) {
	type probe struct {
		key string
		cmd *redis.StatusCmd
	}
	probes := make([]probe, 0, len(c.keys))
	_, perr := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range c.keys {
			probes = append(probes, probe{k, p.SetArgs(ctx, k, "1", redis.SetArgs{TTL: canaryTTL, Get: true})})
		}
		return nil
	})
	allOK = len(probes) > 0
	var keep []string // seen canaries whose SET was refused: their TTL is renewed
	for _, pr := range probes {
		switch err := pr.cmd.Err(); {
		case errors.Is(err, redis.Nil):
			if c.seen[pr.key] {
				flushed = append(flushed, pr.key)
			}
			c.seen[pr.key] = true
		case err == nil:
			c.seen[pr.key] = true
		default:
			allOK = false
			if refusalCode(err) != "" {
				if refused == nil {
					refused = err
				}
				if c.seen[pr.key] {
					keep = append(keep, pr.key)
				}
			}
		}
	}
	if len(keep) > 0 {
		// The reply does not matter: 0 (gone) is found by the next SET that Redis takes, and an error (READONLY,
		// NOPERM refuse PEXPIRE too) changes nothing.
		_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range keep {
				p.PExpire(ctx, k, canaryTTL)
			}
			return nil
		})
	}
	if perr != nil && !errors.Is(perr, redis.Nil) {
		return flushed, refused, allOK, perr
	}
	return flushed, refused, allOK, nil
}

// watchFlush runs the flush canary until ctx ends (see the comment at the top of this file).
func (w *Warmer) watchFlush(ctx context.Context) {
	every := w.cfg.FlushCheckInterval
	if every == 0 {
		every = DefaultFlushCheckInterval
	}
	c := &canaries{prefix: "keepwarm:canary:" + lockstep.NewToken()[:16], seen: map[string]bool{}}
	defer func() {
		// A clean stop removes the canaries; a killed process's expire on their own after canaryTTL.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		for _, k := range c.keys {
			_ = w.rdb.Del(dctx, k).Err()
		}
	}()
	t := time.NewTicker(every)
	defer t.Stop()
	var topo, lastOK time.Time // lastOK: the last check that found every canary in place
	var failing, topoFailing bool
	for {
		if time.Since(topo) >= DefaultNodeCheckInterval || c.keys == nil {
			if err := c.refresh(ctx, w.rdb); err == nil {
				topo, topoFailing = time.Now(), false
			} else if ctx.Err() == nil && !topoFailing {
				topoFailing = true
				w.log.Warn("flush canary: cannot read the cluster's slots; flushes of other masters go unseen until it can",
					"error", err)
			}
		}
		if c.keys != nil {
			flushed, refused, allOK, err := c.check(ctx, w.rdb)
			if ctx.Err() == nil {
				w.refusals.noteCanary(refused, allOK, w.now())
				if allOK {
					w.oomOver()
				}
			}
			if err != nil && ctx.Err() == nil {
				if !failing {
					w.log.Debug("flush canary: Redis error", "error", err)
				}
				failing = true
			} else if err == nil {
				failing = false
			}
			if len(flushed) > 0 {
				// Seen moments ago, so not lapsed: the data set was emptied. Outside a Cluster, that is every key.
				_, cluster := w.rdb.(*redis.ClusterClient)
				var emptied time.Time // the data set was whole then, and is empty now
				if !cluster && !lastOK.IsZero() && w.now().Sub(lastOK) < canaryTTL/2 {
					emptied = lastOK
				}
				w.m.flushes.Inc()
				w.lastFlush.Store(w.now().UnixNano())
				w.log.Warn("the flush canary was gone (Redis flushed, restarted empty, or evicted it): re-reading every hot key",
					"canaries", flushed, "emptied", !emptied.IsZero())
				w.rereadAll("flush", emptied)
			} else if err == nil {
				lastOK = w.now() // the injected clock: rereadAll compares it with keys' learnedAt
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// rereadAll makes every keyspace re-read the PTTL of every hot key it owns at once, judging each reading as after
// a gone event (why: "flush" or "failover"); keys in flight are re-read when their refresh settles. Every key's
// trust ends too: the events of the keys that vanished were never published.
func (w *Warmer) rereadAll(why string, emptied time.Time) {
	w.trust.bump()
	spaces := w.keyspaces()
	var wg sync.WaitGroup
	for _, k := range spaces {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k.rereadAll(why, emptied)
		}()
	}
	wg.Wait()
}

// rereadAll queues every hot key k owns for a PTTL reading judged as after a gone event (see warmer.rereadAll).
// With a non-zero emptied (the whole data set is known gone since then: the one canary of a single server or
// Sentinel group vanished, and was in place at emptied), each owned key whose value the daemon learnt before
// emptied is counted as a miss at once and rebuilt, instead of waiting for its reading (a value learnt since may
// be a rebuild after the flush, and is read as usual): the flush also empties the fleet's member set, and any
// ownership change in the next heartbeats would hand the key to a replica that cannot tell it was flushed.
func (k *keyspace) rereadAll(why string, emptied time.Time) {
	now := k.w.now()
	k.mail.Send(func(k *loopState) { k.rereadOwned(why, emptied, now) })
}

// rereadOwned is rereadAll's message, on the loop.
func (k *loopState) rereadOwned(why string, emptied, now time.Time) {
	k.judgeLeftSinceEmptied(emptied, now)
	for id, h := range k.hotSet {
		if h.persistent || !k.owns(id) {
			continue
		}
		h.invalidated = false // an earlier invalidation does not excuse what the flush removed
		if !emptied.IsZero() && !h.lockGoneAt.IsZero() && !h.lockGoneAt.Before(emptied) {
			// A refresh found its lock gone after Redis was emptied and took it for an invalidation: it was this
			// flush, which removed the value too. A miss of the value known then, dated by its expiry and
			// learnedAt (the key may have been rebuilt since, by the refresh settle scheduled at once, and that
			// newer value is neither counted nor re-dated), unless this replica counted that value's loss already
			// (a notification or a reading judged it before the canary noticed the flush). Dated by the lost
			// value, the fleet's claim also finds another replica's count of the same loss (missclaim.go).
			lost := h.lockGoneExpiry
			already := !h.missedAt.IsZero() && h.missedExpiry.Equal(lost)
			if !lost.IsZero() && !already {
				cur, curLearned, curCounted := h.expiry, h.learnedAt, h.counted
				h.expiry, h.learnedAt = lost, h.lockGoneLearned
				k.countMiss(h, now, "flushed while its refresh was in flight")
				if !cur.IsZero() { // a value learnt since: keep it, and its own count armed
					h.expiry, h.learnedAt, h.counted = cur, curLearned, curCounted
				}
			}
		}
		h.lockGoneAt = time.Time{}
		h.ownWrite = false
		if h.inflight {
			h.pendingGone = why
			if !emptied.IsZero() && !h.expiry.IsZero() && h.learnedAt.Before(emptied) {
				// Counted now, like a key at rest: the value known at emptied is gone, and so is any the batch
				// wrote before the flush; one it writes after leaves a gap from the flush until then. Were it
				// left to the re-read after the batch settles, a publish re-sent after the restart (its first
				// reply lost with the connection: prevUnknown) would be judged as the daemon's own fresh write:
				// 1 of 4 restarts in a soak (seed 6002, track:2074) left such a gap uncounted.
				k.noteGone(h, now)
				h.flushCounted = h.counted
				continue
			}
			k.log.Debug("hot key in flight at a "+why+": judged when its refresh settles", "id", id)
			continue
		}
		if !emptied.IsZero() && !h.expiry.IsZero() && h.learnedAt.Before(emptied) {
			k.noteGone(h, now)
			h.expiry = time.Time{}
			k.q.schedule(h, now)
			continue
		}
		k.log.Debug("hot key re-read after a "+why, "id", id, "expiry", h.expiry, "learned", h.learnedAt)
		h.needPTTL, h.goneEvent, h.flushedSince = true, why, emptied
		k.adopt = append(k.adopt, h)
	}
}

// judgeLeftSinceEmptied counts the keys that left the hot set after Redis was emptied (at emptied) and before the
// canary noticed it: hot and owned when their value was flushed, before the expiry known then. Neither their
// leaving (judged by that expiry, still ahead: setHot) nor the re-read of the hot set (which no longer holds them)
// counted them. After a Redis restart the first access-set poll ranks ids on the scores of a second of reads, and
// a key at the top_n edge that left then was missed by nobody (seed 7002: track:694, 1.05 s). A key back in the hot
// set is the re-read's to judge; one that left owned by another replica, or whose value was learnt after
// emptied (perhaps a rebuild after the flush), is not judged. emptied is the canary's last look at a full Redis,
// up to FlushCheckInterval before the flush itself: a key that left in between was not hot when its value went,
// and is counted all the same. The counter errs high there rather than low (docs/operations.md, "The SLO").
func (k *loopState) judgeLeftSinceEmptied(emptied, now time.Time) {
	if emptied.IsZero() {
		return
	}
	for _, l := range k.leftLog {
		h := l.h
		if !l.Owned || l.LeftAt.Before(emptied) || h.persistent || h.expiry.IsZero() || !h.learnedAt.Before(emptied) ||
			!h.expiry.After(emptied) || k.hotSet[h.id] != nil {
			continue
		}
		k.noteGone(h, now) // once: it marks the expiry counted
	}
}
