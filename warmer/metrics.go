package warmer

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Refresh results, the values of the "result" label of keepwarm_warmer_refreshes_total.
const (
	ResultOK       = "ok"        // a new value was published
	ResultFresh    = "fresh"     // under the lock the key turned out already refreshed by someone else: no query
	ResultLocked   = "locked"    // an app or another replica held the lock: skipped, re-checked later
	ResultMissing  = "missing"   // the origin had no row: the missing policy was applied
	ResultLockLost = "lock_lost" // the lease ran out and another token took the lock before publishing: nothing was written
	// ResultLockGone: the lock key vanished while the lease was still valid: an app invalidated the key after a
	// write to the origin (lockstep.Invalidate), or Redis evicted the lock. Nothing was written; the key is read
	// again soon, so the new row is published.
	ResultLockGone = "lock_gone"
	ResultTooLarge = "too_large" // the value exceeds max_value_bytes: not written, the old one kept (fail-safe)
	ResultError    = "error"     // the origin query or a Redis command failed; the reason label says which
)

// Reasons of ResultError, the values of the "reason" label of keepwarm_warmer_refresh_errors_total.
const (
	ReasonOrigin        = "origin"         // the origin query failed (SQL error, connection refused, server timeout)
	ReasonOriginTimeout = "origin_timeout" // the origin query outlived its bound on the client side
	ReasonPoolExhausted = "pool_exhausted" // no origin connection was free within the pool wait bound
	// ReasonOriginFailing: not queried: the origin's last query failed and every origin slot was busy (with
	// queries that may hang until their timeout), so the fail-safe extended the value without waiting for one.
	ReasonOriginFailing = "origin_failing"
	ReasonOOM           = "oom"       // Redis refused a write: used memory > maxmemory (noeviction)
	ReasonTryAgain      = "tryagain"  // Redis Cluster: the slot is being migrated (TRYAGAIN); retried shortly
	ReasonCluster       = "cluster"   // other Redis Cluster redirections or failures (MOVED, ASK, CLUSTERDOWN)
	ReasonWrongType     = "wrongtype" // a key of the layout holds the wrong type (e.g. the meta key is not a hash)
	ReasonReply         = "reply"     // another Redis error reply
	ReasonTransport     = "transport" // Redis did not answer (timeout, reset, refused)

	// ReasonBadInput: the origin query failed on this id alone with a data error (the Source's BadInput error:
	// SQLSTATE class 22, such as an id the query casts to int that is not a number). The other ids of its batch
	// were fetched apart and written; the id is counted in keepwarm_warmer_invalid_ids_total{source="origin"}
	// and retried with back-off. Not an origin outage: no fail-safe, no "origin failing".
	ReasonBadInput = "bad_input"
)

// Fail-safe modes, the values of the "mode" label of keepwarm_warmer_failsafe_extensions_total.
const (
	FailSafeLocked   = "locked"   // lockstep.ExtendValueMany under the batch's lock: the origin failed, or the value was too large
	FailSafeUnlocked = "unlocked" // lockstep.ExtendValueUnlockedMany: Redis refused the lock for memory (OOM)
)

// metrics are the warmer's Prometheus metrics. Labels are bounded: keyspace and result, never a key or an id.
type metrics struct {
	refreshes      *prometheus.CounterVec   // keyspace, result
	refreshErrors  *prometheus.CounterVec   // keyspace, reason
	refreshSeconds *prometheus.HistogramVec // keyspace
	leadSeconds    *prometheus.HistogramVec // keyspace
	hotExpired     *prometheus.CounterVec   // keyspace: the SLO counter
	vanished       *prometheus.CounterVec   // keyspace: hot keys deleted or evicted before their expiry
	lateNotice     *prometheus.CounterVec   // keyspace: hot keys that expired less than one lead after the daemon learnt of them
	originQueries  *prometheus.CounterVec   // keyspace, result
	originRows     *prometheus.CounterVec   // keyspace
	originSeconds  *prometheus.HistogramVec // keyspace
	locks          *prometheus.CounterVec   // keyspace, result
	leaseExtends   *prometheus.CounterVec   // keyspace, result
	failSafe       *prometheus.CounterVec   // keyspace, mode (FailSafeLocked, FailSafeUnlocked)
	tracked        *prometheus.GaugeVec     // keyspace
	hot            *prometheus.GaugeVec     // keyspace
	persistent     *prometheus.GaugeVec     // keyspace
	queued         *prometheus.GaugeVec     // keyspace
	owned          *prometheus.GaugeVec     // keyspace
	decays         *prometheus.CounterVec   // keyspace
	invalidIDs     *prometheus.CounterVec   // keyspace, source (access_set, lfu, changes, origin)
	judged         *prometheus.CounterVec   // keyspace: refreshes the refresh feedback judged (selection.go)
	wasted         *prometheus.CounterVec   // keyspace: of those, refreshes no read followed
	wasteRatio     *prometheus.GaugeVec     // keyspace: wasted / judged over a window of decay_half_life
	rec            reconcileMetrics
	ev             evictionMetrics
	intake         intakeMetrics

	notificationsOn   prometheus.Gauge   // 1 while keyspace notifications are confirmed on every node
	notificationNodes prometheus.Gauge   // nodes subscribed to keyevents
	flushes           prometheus.Counter // flushes the canary noticed (flush.go)
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	durations := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	leads := []float64{0, .1, .25, .5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}
	m := &metrics{
		flushes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keepwarm_warmer_flushes_detected_total",
			Help: "Times the flush canary found Redis emptied (FLUSHDB, FLUSHALL, SWAPDB, a restart without persistence); every hot key was re-read at once.",
		}),
		refreshes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_refreshes_total",
			Help: "Refresh attempts of hot keys, by keyspace and result (ok, fresh, locked, missing, lock_lost, lock_gone, too_large, error).",
		}, []string{"keyspace", "result"}),
		refreshErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_refresh_errors_total",
			Help: "Refreshes that ended in result error, by keyspace and reason (origin, origin_timeout, pool_exhausted, origin_failing, bad_input, oom, tryagain, cluster, wrongtype, reply, transport).",
		}, []string{"keyspace", "reason"}),
		refreshSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "keepwarm_warmer_refresh_duration_seconds",
			Help:    "Duration of one refresh batch, from lock acquisition to publish.",
			Buckets: durations,
		}, []string{"keyspace"}),
		leadSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "keepwarm_warmer_lead_time_seconds",
			Help:    "TTL the previous value had left when a refreshed value was published (0 if it had expired).",
			Buckets: leads,
		}, []string{"keyspace"}),
		hotExpired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_hot_expired_total",
			Help: "keepwarm's SLO, which should stay at 0: misses of hot keys, once per expiry, counted by the replica that owns the key. A miss is a hot key found absent (expired, evicted, flushed, lost in a failover) whoever rebuilt it afterwards; only an app's or the change stream's invalidation (a del) is excluded. See docs/operations.md, \"The SLO\".",
		}, []string{"keyspace"}),
		vanished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_hot_vanished_total",
			Help: "Of the SLO misses, hot keys found gone before their known expiry (evicted, flushed, lost in a failover).",
		}, []string{"keyspace"}),
		lateNotice: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_hot_late_notice_total",
			Help: "Of the SLO misses, those whose expiry the daemon learnt less than one lead before it (a breakdown, not an exemption).",
		}, []string{"keyspace"}),
		originQueries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_origin_queries_total",
			Help: "Origin (PostgreSQL) queries made by refreshes, by keyspace and result (ok, error, bad_input: failed on a data error, so the batch was split to find the id at fault).",
		}, []string{"keyspace", "result"}),
		originRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_origin_rows_total",
			Help: "Values returned by origin queries.",
		}, []string{"keyspace"}),
		originSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "keepwarm_warmer_origin_query_duration_seconds",
			Help:    "Duration of one origin query (one batch).",
			Buckets: durations,
		}, []string{"keyspace"}),
		locks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_lock_acquisitions_total",
			Help: "Lock acquisitions by the daemon, by result (acquired, held: someone else was rebuilding).",
		}, []string{"keyspace", "result"}),
		leaseExtends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_lease_extensions_total",
			Help: "Renewals of the daemon's lock leases while a batch holds its locks, per lock, by result (ok; lost: the lock was gone or taken; late: no renewal reached Redis within 3/4 of a lease, counted once per stall: the batch goes on and its token-checked publish decides).",
		}, []string{"keyspace", "result"}),
		failSafe: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_failsafe_extensions_total",
			Help: "Hot values whose TTL was extended instead of refreshed (fail-safe), bounded by max_stale, by mode: locked (under the key's lock: the origin failed, or the value was too large), unlocked (Redis refused the lock for memory, OOM with noeviction; extended only where no lock existed).",
		}, []string{"keyspace", "mode"}),
		tracked: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keepwarm_warmer_keys_tracked",
			Help: "Ids tracked per keyspace (bounded by max_tracked).",
		}, []string{"keyspace"}),
		hot: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keepwarm_warmer_keys_hot",
			Help: "Hot keys per keyspace: pinned plus the top_n by score.",
		}, []string{"keyspace"}),
		persistent: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keepwarm_warmer_keys_persistent",
			Help: "Hot keys found without a TTL (PTTL -1); keepwarm reports and never overwrites them.",
		}, []string{"keyspace"}),
		queued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keepwarm_warmer_keys_due",
			Help: "Hot keys whose refresh is due now but not yet started (waiting for origin budget).",
		}, []string{"keyspace"}),
		owned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keepwarm_warmer_keys_owned",
			Help: "Hot keys this replica owns and refreshes; the fleet's other replicas own the rest (equal to keys_hot without a fleet).",
		}, []string{"keyspace"}),
		decays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_access_decays_total",
			Help: "Decays of the access sorted set performed by this daemon.",
		}, []string{"keyspace"}),
		invalidIDs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_invalid_ids_total",
			Help: "Ids skipped because they are not valid ids (invalid UTF-8, empty, too long, or refused by the source: a NUL byte for PostgreSQL), by source: access_set " +
				"(members, removed from the set), lfu (cache keys found by the LFU scan, left alone), changes (ids of the change stream, not refreshed) " +
				"or origin (ids whose origin query failed on a data error on their own: not written, retried with back-off).",
		}, []string{"keyspace", "source"}),
		judged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_refreshes_judged_total",
			Help: "Published refreshes of hot keys that the access set names, judged at the key's next refresh: was it read in between?",
		}, []string{"keyspace"}),
		wasted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_refreshes_wasted_total",
			Help: "Judged refreshes that no read followed before the key's next refresh (the access set's score did not rise).",
		}, []string{"keyspace"}),
		wasteRatio: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keepwarm_warmer_wasted_refresh_ratio",
			Help: "Share of judged refreshes that were wasted, over a window that fades with decay_half_life (0..1). High: lower top_n or raise min_score.",
		}, []string{"keyspace"}),
		rec:    newReconcileMetrics(),
		ev:     newEvictionMetrics(),
		intake: newIntakeMetrics(),
		notificationsOn: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keepwarm_warmer_notifications_enabled",
			Help: "1 while keyspace notifications are subscribed and notify-keyspace-events has every flag the daemon needs (Exeg$) on every node it listens to (each Cluster master); else 0.",
		}),
		notificationNodes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keepwarm_warmer_notification_nodes",
			Help: "Redis nodes the daemon is subscribed to for keyspace notifications (every master of a Cluster, else 1).",
		}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range append([]prometheus.Collector{m.refreshes, m.refreshErrors, m.refreshSeconds, m.leadSeconds, m.hotExpired, m.vanished, m.lateNotice,
		m.originQueries, m.originRows, m.originSeconds, m.locks, m.leaseExtends, m.failSafe, m.tracked, m.hot,
		m.persistent, m.queued, m.owned, m.decays, m.invalidIDs, m.judged, m.wasted, m.wasteRatio, m.notificationsOn,
		m.notificationNodes, m.flushes}, m.subCollectors()...) {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	return m, errors.Join(errs...)
}

// subCollectors are the collectors of the metrics structs of reconcile.go, eviction.go and intake.go.
func (m *metrics) subCollectors() []prometheus.Collector {
	return append(append(m.rec.collectors(), m.ev.collectors()...), m.intake.collectors()...)
}

// forget removes the keyspace's series, when a reload removes the keyspace.
func (m *metrics) forget(ks string) {
	for _, v := range []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{m.refreshes, m.refreshErrors, m.refreshSeconds, m.leadSeconds, m.hotExpired, m.vanished, m.lateNotice, m.originQueries, m.originRows,
		m.originSeconds, m.locks, m.leaseExtends, m.failSafe, m.tracked, m.hot, m.persistent, m.queued, m.owned, m.decays,
		m.invalidIDs, m.judged, m.wasted, m.wasteRatio} {
		v.DeletePartialMatch(prometheus.Labels{"keyspace": ks})
	}
	for _, c := range m.subCollectors() {
		if v, ok := c.(interface {
			DeletePartialMatch(prometheus.Labels) int
		}); ok {
			v.DeletePartialMatch(prometheus.Labels{"keyspace": ks})
		}
	}
}
