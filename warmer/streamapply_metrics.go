package warmer

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Results of a changed id, the values of the "result" label of keepwarm_changes_applied_total.
const (
	// ChangeNotCached: the id's key was neither hot, cached nor being rebuilt: left alone.
	ChangeNotCached = "not_cached"
	// ChangeInvalidated: on_change = "invalidate" deleted the key and its lock.
	ChangeInvalidated = "invalidated"
	// ChangeInvalidID: the row's id column does not make a valid id for the key template, or the source refuses
	// it (IDValidator: a NUL byte for PostgreSQL), or the origin query failed on it alone with a data error
	// (ReasonBadInput: its cached key, now stale, is invalidated). Not refreshed, and not retried; counted in
	// keepwarm_warmer_invalid_ids_total too.
	ChangeInvalidID = "invalid_id"
)

// changeMetrics are the metrics of Changes and StreamLease (keepwarm_changes_*, keepwarm_stream_lease_*).
type changeMetrics struct {
	rows           prometheus.Counter
	txns           prometheus.Counter
	applied        *prometheus.CounterVec // keyspace, result
	commitToRedis  prometheus.Histogram
	visibleToRedis prometheus.Histogram
	visibleWait    *prometheus.HistogramVec // keyspace
	visibleTimeout *prometheus.CounterVec   // keyspace
	late           *prometheus.CounterVec   // keyspace
	staleSeconds   *prometheus.CounterVec   // keyspace
	resyncKeys     prometheus.Counter
}

func newChangeMetrics(reg prometheus.Registerer) (*changeMetrics, error) {
	m := &changeMetrics{
		rows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keepwarm_changes_rows_total",
			Help: "Row changes of feeding tables handed to the warmer (a row retried after a failure counts again).",
		}),
		txns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keepwarm_changes_transactions_applied_total",
			Help: "Committed transactions whose changes are all published to Redis (then acknowledged to PostgreSQL).",
		}),
		applied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_changes_applied_total",
			Help: "Changed ids applied, after coalescing, by keyspace and result (ok, missing, locked, not_cached, invalidated, invalid_id).",
		}, []string{"keyspace", "result"}),
		commitToRedis: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "keepwarm_changes_commit_to_redis_seconds",
			Help:    "Time from a transaction's commit (origin clock) until every key it changed was published to Redis.",
			Buckets: []float64{.005, .01, .025, .05, .1, .15, .2, .3, .5, .75, 1, 1.5, 2, 5, 10, 30},
		}),
		visibleToRedis: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "keepwarm_changes_visible_to_redis_seconds",
			Help:    "Time from a transaction's commit becoming visible (at the latest look that found it not visible, else its commit time) until every key it changed was published to Redis.",
			Buckets: []float64{.005, .01, .025, .05, .1, .15, .2, .3, .5, .75, 1, 1.5, 2, 5, 10, 30},
		}),
		visibleWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "keepwarm_changes_visibility_wait_seconds",
			Help:    "Time a batch waited for its commits to become visible on the server its keyspace reads (a synchronous standby's confirmation on a primary, replay on a replica), by keyspace.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"keyspace"}),
		visibleTimeout: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_changes_visibility_timeouts_total",
			Help: "Batches whose commits did not become visible within visibility_timeout (retried, not acknowledged), by keyspace.",
		}, []string{"keyspace"}),
		late: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_changes_late_total",
			Help: "Changed keys published (or invalidated) later than the freshness bound after their commit became visible: the freshness SLO counter, by keyspace.",
		}, []string{"keyspace"}),
		staleSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_changes_stale_seconds_total",
			Help: "Sum, over late changed keys, of the time from the commit becoming visible until the key was published, by keyspace.",
		}, []string{"keyspace"}),
		resyncKeys: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keepwarm_changes_resync_keys_total",
			Help: "Hot keys refreshed by resyncs (after the replication slot was recreated).",
		}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.rows, m.txns, m.applied, m.commitToRedis, m.visibleToRedis, m.visibleWait,
		m.visibleTimeout, m.late, m.staleSeconds, m.resyncKeys} {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}
