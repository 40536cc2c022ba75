package warmer

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Under memory pressure Redis evicts keys, and keepwarm's own signals with them: hot values vanish (allkeys-*
// policies evict them like any key; volatile-* ones evict only keys with a TTL, which all cache values have), and
// the access sorted set, which has no TTL, goes under allkeys-* policies. Neither may go unnoticed: the daemon
// counts hot values that vanish before their expiry (keepwarm_warmer_hot_vanished_total, and the evictions that
// notifications announce in keepwarm_warmer_hot_evicted_total), reports an episode of them vanishing in bulk,
// and reports an access set that was emptied, each with a metric and a log line.

// Bulk vanishing: at least bulkVanishMin hot values, and at least bulkVanishFraction of the hot set, vanished
// before their expiry within one bulkVanishWindow.
const (
	bulkVanishWindow   = 10 * time.Second
	bulkVanishMin      = 10
	bulkVanishFraction = 0.01
)

// vanishWindow counts hot values that vanished in the current window, and whether an episode is being reported.
type vanishWindow struct {
	start time.Time
	n     int
	bulk  bool // an episode began and has not ended (a whole window below the threshold ends it)
}

// noteVanished counts one hot value that vanished before its expiry, and reports the start of an episode
// of them vanishing in bulk once.
func (k *loopState) noteVanished(now time.Time) {
	v := &k.vanish
	if now.Sub(v.start) >= bulkVanishWindow {
		if v.n < k.bulkThreshold() {
			v.bulk = false
		}
		v.start, v.n = now, 0
	}
	v.n++
	if v.bulk || v.n < k.bulkThreshold() {
		return
	}
	v.bulk = true
	k.w.m.ev.bulk.WithLabelValues(k.name).Inc()
	k.log.Warn("hot values are vanishing in bulk before their expiry: Redis is evicting them under memory pressure "+
		"(see maxmemory-policy in docs/operations.md), or an app deleted them; keepwarm rewrites them as they go",
		"vanished", v.n, "within", now.Sub(v.start), "hot_keys", len(k.hotSet))
}

func (k *loopState) bulkThreshold() int {
	return max(bulkVanishMin, int(bulkVanishFraction*float64(len(k.hotSet))))
}

// checkAccessSet is called after each poll read the top of the access set, with the count of members read.
// When a set that had members reads empty, it asks Redis whether the key still exists (one EXISTS, only then):
// a set that is gone was evicted or deleted (FLUSHALL, an eviction under an allkeys-* policy), and the hot set
// now rests on the scores the daemon remembers. That is counted in keepwarm_warmer_access_set_lost_total and
// logged once per loss.
func (k *loopState) checkAccessSet(ctx context.Context, cfg KeyspaceConfig, members int) {
	had := k.accessSeen
	k.accessSeen = members > 0
	if members > 0 || !had {
		return
	}
	n, err := k.w.rdb.Exists(ctx, cfg.AccessKey).Result()
	if err != nil {
		k.redisError(ctx, "check access set", err)
		return
	}
	if n > 0 {
		return // it exists but nothing in it scores min_score any more: cold, not lost
	}
	k.w.m.ev.accessLost.WithLabelValues(k.name).Inc()
	k.log.Warn("the access set is gone: evicted (an allkeys-* maxmemory-policy) or deleted; the hot set now rests "+
		"on the scores keepwarm remembers until apps record reads again", "access_key", cfg.AccessKey)
}

// restoreLost writes back the access scores that fell further than decay explains in this poll (tracker.observe,
// lostScore): the access set lost them (a flush, a restart without persistence, an eviction, a failover to a
// replica behind). ZADD GT raises a score to the remembered one and never lowers it, so the reads apps recorded
// since the loss are kept when they are more, and every replica, remembering about the same, can write at once.
// The replicas then read one access set again, and so agree on the hot set. Errors are logged (the remembered
// scores still rank the ids on this replica, and the next loss it reads is written back again).
func (k *loopState) restoreLost(ctx context.Context, cfg KeyspaceConfig) {
	zs := k.tr.takeLost()
	if len(zs) == 0 {
		return
	}
	for start := 0; start < len(zs); start += syncPage {
		page := zs[start:min(start+syncPage, len(zs))]
		if err := k.w.rdb.ZAddGT(ctx, cfg.AccessKey, page...).Err(); err != nil {
			k.redisError(ctx, "restore access scores", err)
			return
		}
	}
	k.w.m.ev.restored.WithLabelValues(k.name).Add(float64(len(zs)))
	// Apps read the lost ids again one by one, and each poll writes back those read since the last: one loss
	// takes a few polls. Logged once a minute at most; the counter has every one.
	level, now := slog.LevelDebug, k.w.now()
	if now.Sub(k.restoreLogged) >= time.Minute {
		level, k.restoreLogged = slog.LevelWarn, now
	}
	k.log.Log(ctx, level, "access scores fell further than decay explains (the access set was emptied, evicted or "+
		"failed over): wrote back the scores keepwarm remembers, so that the hot set does not churn",
		"access_key", cfg.AccessKey, "ids", len(zs))
}

// evictionMetrics are the metrics of keepwarm's signals vanishing under memory pressure.
type evictionMetrics struct {
	evicted    *prometheus.CounterVec // keyspace: hot values Redis announced as evicted
	bulk       *prometheus.CounterVec // keyspace: episodes of hot values vanishing in bulk
	accessLost *prometheus.CounterVec // keyspace: the access set found gone
	restored   *prometheus.CounterVec // keyspace: access scores written back after a loss (restoreLost)
}

func newEvictionMetrics() evictionMetrics {
	return evictionMetrics{
		evicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_hot_evicted_total",
			Help: "Hot values that Redis evicted (keyspace notification \"evicted\"); also counted in keepwarm_warmer_hot_vanished_total.",
		}, []string{"keyspace"}),
		bulk: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_hot_vanished_bulk_total",
			Help: "Episodes of hot values vanishing in bulk before their expiry (at least 10, and 1% of the hot set, within 10 s): usually evictions under memory pressure.",
		}, []string{"keyspace"}),
		accessLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_access_set_lost_total",
			Help: "Times the access sorted set was found gone after it had members (evicted or deleted).",
		}, []string{"keyspace"}),
		restored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_access_scores_restored_total",
			Help: "Access scores that fell further than decay explains (the access set emptied, evicted or failed over), written back with the score keepwarm remembered (ZADD GT).",
		}, []string{"keyspace"}),
	}
}

func (m evictionMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.evicted, m.bulk, m.accessLost, m.restored}
}
