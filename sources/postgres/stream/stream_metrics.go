package stream

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the change stream's Prometheus metrics (keepwarm_stream_*). Labels are bounded: the resync
// reason only.
type metrics struct {
	received    prometheus.Counter
	txns        prometheus.Counter
	resyncs     *prometheus.CounterVec // reason
	reconnects  prometheus.Counter
	applyErrors prometheus.Counter
	streaming   prometheus.Gauge
	unpublished prometheus.Gauge
	problems    *prometheus.GaugeVec // kind
	overflowed  prometheus.Counter
	oldUnknown  prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keepwarm_stream_changes_received_total",
			Help: "Row changes of feeding tables received from the replication slot (committed transactions only).",
		}),
		txns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keepwarm_stream_transactions_received_total",
			Help: "Committed transactions received from the replication slot.",
		}),
		resyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_stream_resyncs_total",
			Help: "Resyncs (every hot key refreshed, every other cached key of the fed keyspaces invalidated) by reason: created (slot created or found missing), invalidated (slot lost WAL, recreated), truncate, publication (the publication repaired: a feeding table added back, actions published), rebuilt (a feeding table's OID changed), large_transaction (a transaction above max_transaction_changes), publication_gap (the publication dropped and created again: slot recreated), reconfigured (fed_by changed by a reload).",
		}, []string{"reason"}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keepwarm_stream_reconnects_total",
			Help: "Times the replication connection failed and was re-established.",
		}),
		applyErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keepwarm_stream_apply_errors_total",
			Help: "Batches of changes whose refresh failed and was retried (not acknowledged meanwhile).",
		}),
		streaming: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keepwarm_stream_streaming",
			Help: "1 while this daemon streams from the slot, else 0 (standby, connecting).",
		}),
		overflowed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keepwarm_stream_transactions_overflowed_total",
			Help: "Transactions that changed more rows than max_transaction_changes: their changes were dropped and every hot key refreshed instead.",
		}),
		unpublished: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keepwarm_stream_tables_unpublished",
			Help: "Feeding tables the publication lacked at the last check (create_publication off, or the role may not add them): their changes do not arrive. Should be 0.",
		}),
		problems: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keepwarm_stream_problems",
			Help: "Known gaps between what the keyspaces need and what the change stream receives, by kind (unpublished, publish_actions, column_list, row_filter, generated_column, column_missing, replica_identity). Should be 0.",
		}, []string{"kind"}),
		oldUnknown: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keepwarm_stream_old_ids_unknown_total",
			Help: "UPDATEs of a feeding table whose old fed_by values PostgreSQL did not send (the column is outside a replica identity that is not FULL): a row moved to another id left the old id's key stale.",
		}),
	}
	for _, r := range resyncReasons {
		m.resyncs.WithLabelValues(r)
	}
	for _, k := range problemKinds {
		m.problems.WithLabelValues(k)
	}
	return m
}

// register registers m and the lag gauges, read from s, on reg (nil: nothing).
func (m *metrics) register(reg prometheus.Registerer, s *Stream) {
	if reg == nil {
		return
	}
	lagBytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "keepwarm_stream_lag_bytes",
		Help: "WAL between the server's end (last heard) and the LSN acknowledged as applied to Redis.",
	}, func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		b, _ := s.lagLocked(time.Now())
		return float64(b)
	})
	lagSeconds := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "keepwarm_stream_lag_seconds",
		Help: "Age of the oldest received transaction not yet applied to Redis (0 when caught up), from its commit time.",
	}, func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		_, secs := s.lagLocked(time.Now())
		return secs
	})
	reg.MustRegister(m.received, m.txns, m.resyncs, m.reconnects, m.applyErrors, m.streaming, m.unpublished, m.problems, m.overflowed, m.oldUnknown,
		lagBytes, lagSeconds)
}
