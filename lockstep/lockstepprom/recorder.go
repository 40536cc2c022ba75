// Package lockstepprom is lockstep's Prometheus Recorder, in its own package so that apps importing lockstep do
// not pull in client_golang (and procfs, protobuf) unless they want these metrics.
//
//	rec, err := lockstepprom.New(reg) // reg: the app's prometheus.Registerer
//	c, err := lockstep.New(rdb, "product", keys, load, ttl, lockstep.WithRecorder(rec))
package lockstepprom

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keepwarm/keepwarm/lockstep"
)

// Recorder is a lockstep.Recorder that exports Prometheus metrics, labelled by keyspace (and result where there
// is one), never by key or id:
//
//	keepwarm_lockstep_hits_total{keyspace}
//	keepwarm_lockstep_misses_total{keyspace}
//	keepwarm_lockstep_stale_serves_total{keyspace}
//	keepwarm_lockstep_lock_contentions_total{keyspace}
//	keepwarm_lockstep_early_refreshes_total{keyspace}
//	keepwarm_lockstep_rebuild_duration_seconds{keyspace,result}  histogram; its _count counts rebuilds
//	keepwarm_lockstep_wait_duration_seconds{keyspace,result}     histogram
//	keepwarm_lockstep_near_hits_total{keyspace}           reads served from the near cache (also in hits_total)
//	keepwarm_lockstep_near_bypasses_total{keyspace}       reads that skipped the near cache: its connection was down
//	keepwarm_lockstep_near_invalidations_total{keyspace}  keys invalidated, flushes and connection losses
//	keepwarm_lockstep_near_bytes{keyspace}                gauge: bytes the near cache holds
//
// One Recorder may serve every lockstep.Client of a process. It is also a prometheus.Collector.
type Recorder struct {
	hits, misses, stale, contention, early *prometheus.CounterVec
	rebuild, wait                          *prometheus.HistogramVec
	nearHits, nearBypasses, nearInvalid    *prometheus.CounterVec
	nearBytes                              *prometheus.GaugeVec
}

var _ lockstep.Recorder = (*Recorder)(nil)
var _ lockstep.NearRecorder = (*Recorder)(nil)
var _ prometheus.Collector = (*Recorder)(nil)

// New makes a Recorder and registers its metrics with reg (no global registry). It returns an error wrapping
// lockstep.ErrInvalidArgument when reg is nil, or the registration error (e.g. the metrics are already
// registered there).
func New(reg prometheus.Registerer) (*Recorder, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: registerer: nil", lockstep.ErrInvalidArgument)
	}
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keepwarm", Subsystem: "lockstep", Name: name, Help: help,
		}, []string{"keyspace"})
	}
	r := &Recorder{
		hits:         counter("hits_total", "Reads answered from the cache key on the first read."),
		misses:       counter("misses_total", "Reads that found no value on the first read."),
		stale:        counter("stale_serves_total", "Reads answered with the stale copy after waiting for a rebuild."),
		contention:   counter("lock_contentions_total", "Rebuild locks found held by another process."),
		early:        counter("early_refreshes_total", "XFetch decisions to refresh a value before it expires."),
		nearHits:     counter("near_hits_total", "Reads served from the near cache in process memory."),
		nearBypasses: counter("near_bypasses_total", "Reads that skipped the near cache because its invalidation connection was down."),
		nearInvalid:  counter("near_invalidations_total", "Near cache invalidations: keys changed, flushes and invalidation connection losses."),
		nearBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "keepwarm", Subsystem: "lockstep", Name: "near_bytes",
			Help: "Bytes held by the near cache (keys, values and bookkeeping).",
		}, []string{"keyspace"}),
		rebuild: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "keepwarm", Subsystem: "lockstep", Name: "rebuild_duration_seconds",
			Help:    "Duration of rebuilds under the lock (load and publish), by result.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"keyspace", "result"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "keepwarm", Subsystem: "lockstep", Name: "wait_duration_seconds",
			Help:    "Time followers waited for another process's rebuild, by result.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2, 5},
		}, []string{"keyspace", "result"}),
	}
	if err := reg.Register(r); err != nil {
		return nil, fmt.Errorf("lockstepprom: register metrics: %w", err)
	}
	return r, nil
}

func (r *Recorder) collectors() []prometheus.Collector {
	return []prometheus.Collector{r.hits, r.misses, r.stale, r.contention, r.early, r.rebuild, r.wait,
		r.nearHits, r.nearBypasses, r.nearInvalid, r.nearBytes}
}

// Describe implements prometheus.Collector.
func (r *Recorder) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range r.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (r *Recorder) Collect(ch chan<- prometheus.Metric) {
	for _, c := range r.collectors() {
		c.Collect(ch)
	}
}

// Hit implements lockstep.Recorder.
func (r *Recorder) Hit(ks string) { r.hits.WithLabelValues(ks).Inc() }

// Miss implements lockstep.Recorder.
func (r *Recorder) Miss(ks string) { r.misses.WithLabelValues(ks).Inc() }

// StaleServe implements lockstep.Recorder.
func (r *Recorder) StaleServe(ks string) { r.stale.WithLabelValues(ks).Inc() }

// LockContention implements lockstep.Recorder.
func (r *Recorder) LockContention(ks string) { r.contention.WithLabelValues(ks).Inc() }

// EarlyRefresh implements lockstep.Recorder.
func (r *Recorder) EarlyRefresh(ks string) { r.early.WithLabelValues(ks).Inc() }

// Rebuild implements lockstep.Recorder.
func (r *Recorder) Rebuild(ks string, d time.Duration, result string) {
	r.rebuild.WithLabelValues(ks, result).Observe(d.Seconds())
}

// Wait implements lockstep.Recorder.
func (r *Recorder) Wait(ks string, d time.Duration, result string) {
	r.wait.WithLabelValues(ks, result).Observe(d.Seconds())
}

// NearHit implements lockstep.NearRecorder.
func (r *Recorder) NearHit(ks string) { r.nearHits.WithLabelValues(ks).Inc() }

// NearBypass implements lockstep.NearRecorder.
func (r *Recorder) NearBypass(ks string) { r.nearBypasses.WithLabelValues(ks).Inc() }

// NearInvalidation implements lockstep.NearRecorder.
func (r *Recorder) NearInvalidation(ks string) { r.nearInvalid.WithLabelValues(ks).Inc() }

// NearBytes implements lockstep.NearRecorder.
func (r *Recorder) NearBytes(ks string, n int64) { r.nearBytes.WithLabelValues(ks).Set(float64(n)) }
