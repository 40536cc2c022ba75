package warmer

import (
	"context"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// FullSyncEvery is how often the whole tracked window of the access sorted set (up to max_tracked ids) is read;
// between syncs only the top of the set (2×top_n) is read on each poll.
const FullSyncEvery = time.Minute

const syncPage = 10000

// poll reads the hot-key signals (the access sorted set, and Redis LFU counters where enabled), decays and trims
// the access set, and recomputes the hot set.
func (k *loopState) poll(ctx context.Context) {
	cfg := k.config()
	now := k.w.now()
	window := int64(2 * cfg.TopN)
	var zs []redis.Z
	var err error
	if window > 0 { // else pinned ids only: the access set is not read
		var bad []string
		zs, bad, err = k.readTop(ctx, cfg, window)
		// Removed before the full sync below reads the set, so that each is counted once.
		k.skipInvalid(ctx, cfg, sourceAccessSet, bad)
	}
	if err != nil {
		// Go on without the signal: pinned ids are hot whatever Redis says.
		k.redisError(ctx, "read access set", err)
		zs = nil
	} else if window > 0 {
		k.checkAccessSet(ctx, cfg, len(zs))
	}
	k.maybeCheckLFU(ctx, cfg, now)
	lfu := k.scanLFU(ctx, cfg)
	unix := now.Unix()
	k.tr.halfLife = cfg.DecayHalfLife // before the reads go in: observe judges a fall by it
	k.tr.age(unix)                    // before this poll's reads go in
	syncDue := now.Sub(k.lastSync) >= FullSyncEvery
	if syncDue && err == nil && window > 0 && int64(cfg.MaxTracked) > window {
		k.fullSync(ctx, cfg, lfu, unix)
		k.lastSync = now
	}
	if err == nil {
		k.redisOK()
	}

	k.logInvalid()
	// A pinned-only keyspace (top_n 0) has the pinned ids as its hot set, whatever the signals say: rebuilding and
	// comparing that set on every poll cost each replica about 1 s of CPU per poll at 1,000,000 pinned ids
	// (docs/benchmarks.md §14). It is recomputed only when the pins change.
	pinnedOnly := cfg.TopN == 0
	keep := pinnedOnly && k.pinnedHotValid && k.pinnedHotGen == k.tr.pinnedGen
	cands := make([]string, 0, len(zs)+len(lfu))
	for _, z := range zs {
		if id, ok := z.Member.(string); ok {
			k.tr.observe(id, z.Score, unix)
			cands = append(cands, id)
		}
	}
	for id, f := range lfu {
		k.tr.observeLFU(id, f, unix)
		cands = append(cands, id)
	}
	k.restoreLost(ctx, cfg)
	// The hot set is frozen while the origin fails: the fail-safe keeps every hot value alive, and a key that
	// dropped out at the top_n cut-off now would expire into the outage. Pins still apply (update).
	if !k.origin.ongoing() && !keep {
		for id := range k.hotSet {
			cands = append(cands, id)
		}
		k.setHot(k.tr.selectHot(cands, cfg.TopN, cfg.MinScore, unix))
		k.pinnedHotValid, k.pinnedHotGen = pinnedOnly, k.tr.pinnedGen
	}
	k.tr.trim()
	k.w.m.tracked.WithLabelValues(cfg.Name).Set(float64(len(k.tr.entries)))
	if err == nil {
		k.polledOnce.Do(func() { close(k.polled) })
	}

	k.decay(ctx, cfg)
}

// fullSync reads the top max_tracked members of the access set in pages, so that the tracked set mirrors it. Each
// page is folded into the tracker as soon as it arrives (on the loop, one page at a time) rather than
// collected first: with a million tracked ids, growing one slice of every member cost more CPU (copying, and the
// garbage collections the copies caused) than reading the set did.
func (k *loopState) fullSync(ctx context.Context, cfg KeyspaceConfig, lfu map[string]uint8, unix int64) {
	for start := int64(0); start < int64(cfg.MaxTracked); start += syncPage {
		stop := min(start+syncPage, int64(cfg.MaxTracked)) - 1
		page, err := k.w.rdb.ZRevRangeWithScores(ctx, cfg.AccessKey, start, stop).Result()
		if err != nil {
			k.redisError(ctx, "sync access set", err)
			return
		}
		var bad []string
		for _, z := range page {
			if id, ok := z.Member.(string); ok {
				if cfg.validID(id) != nil {
					bad = append(bad, id)
					continue
				}
				k.tr.observe(id, z.Score, unix)
			}
		}
		removed := k.skipInvalid(ctx, cfg, sourceAccessSet, bad)
		if int64(len(page)) < stop-start+1 {
			return
		}
		// Removing the page's invalid members moved the rest of the set up by as many ranks. (When the ZREM
		// failed nothing moved, and the loop goes on to the next page as usual.)
		start -= removed
	}
}

// readTop reads the access set's best members (those scoring at least min_score, when set) and returns up to
// window of them that are valid ids, best first, and apart the members that are not valid ids
// (lockstep.Keys.ValidateID fails: invalid UTF-8, empty, too long; or the source refuses them, IDValidator: a NUL
// byte for PostgreSQL). Those never take a hot slot: reading goes on past them, up to max_tracked members in
// all, so a flood of invalid members cannot hide the real hot ids.
// Without invalid members it is one ZREVRANGE of window members.
func (k *keyspace) readTop(ctx context.Context, cfg KeyspaceConfig, window int64) (zs []redis.Z, bad []string, err error) {
	limit := max(int64(cfg.MaxTracked), window)
	n := window
	for read := int64(0); int64(len(zs)) < window && read < limit; n = min(syncPage, limit-read) {
		var page []redis.Z
		if cfg.MinScore > 0 {
			page, err = k.w.rdb.ZRevRangeByScoreWithScores(ctx, cfg.AccessKey, &redis.ZRangeBy{
				Max: "+inf", Min: formatScore(cfg.MinScore), Offset: read, Count: n}).Result()
		} else {
			page, err = k.w.rdb.ZRevRangeWithScores(ctx, cfg.AccessKey, read, read+n-1).Result()
		}
		if err != nil {
			return nil, nil, err
		}
		read += int64(len(page))
		for _, z := range page {
			id, ok := z.Member.(string)
			switch {
			case !ok:
			case cfg.validID(id) != nil:
				bad = append(bad, id)
			case int64(len(zs)) < window:
				zs = append(zs, z)
			}
		}
		if int64(len(page)) < n {
			break
		}
	}
	return zs, bad, nil
}

// decayEvery is how often the access set's scores are multiplied by 0.5^(decayEvery/half-life).
func decayEvery(halfLife time.Duration) time.Duration {
	return min(max(halfLife/10, time.Second), time.Minute)
}

// decay halves access scores every half-life, atomically in Redis (ZUNIONSTORE of the set onto itself with a
// weight), then trims the set to max_tracked members, lowest scores first. A lease key makes every daemon
// replica share one decay per interval instead of each applying its own.
func (k *keyspace) decay(ctx context.Context, cfg KeyspaceConfig) {
	every := decayEvery(cfg.DecayHalfLife)
	ok, err := k.w.rdb.SetNX(ctx, "keepwarm:decay:"+cfg.Name, k.w.now().UnixMilli(), every).Result()
	if err != nil || !ok {
		return
	}
	weight := math.Pow(0.5, every.Seconds()/cfg.DecayHalfLife.Seconds())
	pipe := k.w.rdb.Pipeline()
	pipe.ZUnionStore(ctx, cfg.AccessKey, &redis.ZStore{Keys: []string{cfg.AccessKey}, Weights: []float64{weight}})
	pipe.ZRemRangeByRank(ctx, cfg.AccessKey, 0, -int64(cfg.MaxTracked)-1)
	pipe.ZRemRangeByScore(ctx, cfg.AccessKey, "-inf", "(0.001")
	if _, err := pipe.Exec(ctx); err != nil {
		k.redisError(ctx, "decay access set", err)
		return
	}
	k.w.m.decays.WithLabelValues(cfg.Name).Inc()
}

func formatScore(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// setHot applies a new hot set: newly hot ids are adopted (their expiry is learnt with PTTL), ids no longer hot
// leave the queue but stay tracked. An owned key that leaves at or after its known expiry, not judged since, may
// have expired while hot: it is read once more (judgeLeft), also within expiryTolerance of that expiry, where only
// the reading can tell (seed 7201: track:53 left 213 ms after its expiry, missing 1.10 s, counted by nobody).
func (k *loopState) setHot(hot map[string]bool) {
	changed := false
	now := k.w.now()
	for id, h := range k.hotSet {
		if !hot[id] {
			changed = true
			// In flight too: the batch's result is dropped once the key has left (settleOne), so it is judged
			// here. A refresh sent before a Redis pause and answered after it, for a key that left at the first
			// poll after the pause, was counted by nobody (seed 6003: track:2011, 7.67 s).
			owned := k.owns(id)
			if !h.persistent && !h.counted && !h.missing && !h.invalidated && !h.expiry.IsZero() &&
				!now.Before(h.expiry) && owned {
				k.left = append(k.left, h)
			}
			k.log.Debug("key left the hot set", "id", id, "owned", owned, "expiry", h.expiry, "inflight", h.inflight)
			k.noteLeft(h, now, owned)
			k.q.remove(h)
			k.cq.remove(h)
			h.e.hot = nil
			h.e.leftHot()
			delete(k.hotSet, id)
		}
	}
	sec := now.Unix()
	for id := range hot {
		if _, ok := k.hotSet[id]; ok {
			continue
		}
		changed = true
		e := k.tr.entries[id]
		if e == nil {
			e = k.tr.observe(id, 0, sec)
		}
		k.hotSerial++
		h := &hotState{id: id, serial: k.hotSerial, e: e, idx: -1, cidx: -1, needPTTL: true, hotSince: now}
		if k.owns(id) {
			h.ownedSince = now
		}
		e.hot = h
		k.hotSet[id] = h
		k.adopt = append(k.adopt, h)
	}
	if changed || k.hot.Load() == nil {
		k.publishHot()
		k.ownedMemo = ownedMemo{}
	}
	k.gauges()
}

// gauges updates the keyspace's gauges.
func (k *loopState) gauges() {
	persistent := 0
	for _, h := range k.hotSet {
		if h.persistent {
			persistent++
		}
	}
	k.w.m.hot.WithLabelValues(k.cfg.Name).Set(float64(len(k.hotSet)))
	k.w.m.tracked.WithLabelValues(k.cfg.Name).Set(float64(len(k.tr.entries)))
	k.w.m.persistent.WithLabelValues(k.cfg.Name).Set(float64(persistent))
	k.w.m.owned.WithLabelValues(k.cfg.Name).Set(float64(k.owned()))
}
