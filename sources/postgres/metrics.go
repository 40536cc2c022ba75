package postgres

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the source's Prometheus metrics. Labels are bounded: keyspace only.
type metrics struct {
	poolWait *prometheus.HistogramVec // keyspace
}

// newMetrics registers the source's metrics on reg. Every keyspace's Source shares one registry, so a collector
// that is already registered (by the first Source) is reused rather than reported as a conflict.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	poolWait := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "keepwarm_origin_pool_wait_seconds",
		Help:    "Time a Fetch waited for a PostgreSQL pool connection, by keyspace; waits cut off by pool_wait_timeout included.",
		Buckets: []float64{.0001, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"keyspace"})
	if err := reg.Register(poolWait); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, err
		}
		existing, ok := are.ExistingCollector.(*prometheus.HistogramVec)
		if !ok {
			return nil, err
		}
		poolWait = existing
	}
	return &metrics{poolWait: poolWait}, nil
}
