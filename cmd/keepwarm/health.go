package main

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keepwarm/keepwarm/sources/postgres/stream"
)

// The daemon's health has three levels (docs/operations.md, "Readiness and degraded states"):
//   - not alive (/livez 503): the scheduler loop is wedged; a restart is the fix.
//   - not ready (/readyz 503): this replica cannot do its job (Redis or PostgreSQL unreachable, Redis refusing
//     writes, every refresh refused, a keyspace's query failing its check); another replica, or time, is the fix.
//   - degraded (/readyz 200, named in its body): ready, but part of the job is not done, and an operator must act:
//     the change stream is down or not advancing, or PostgreSQL does not send what a keyspace needs.

// Degraded checks, the values of the "check" label of keepwarm_degraded.
const (
	checkStreamDown    = "stream_down"    // this daemon holds the stream lease but has not streamed for streamStallAfter
	checkStreamStalled = "stream_stalled" // received changes not applied for streamStallAfter
	checkStreamProblem = "stream_problem" // one per stream.Problem: a table, action or column the stream lacks
)

var degradedChecks = []string{checkStreamDown, checkStreamStalled, checkStreamProblem}

// streamStallAfter is how long the change stream may be down (holding the lease) or hold changes it has not
// applied before the daemon reports itself degraded: longer than a reconnect's back-off steps and a resync of a
// few thousand hot keys take, shorter than an operator's patience.
const streamStallAfter = 30 * time.Second

// degradation is one part of the job not being done while the daemon is ready.
type degradation struct {
	Check  string `json:"check"` // one of degradedChecks
	Detail string `json:"detail"`
}

// degradations returns what is degraded now, without I/O: the change stream's state and problems (only on the
// daemon that holds the stream lease; a standby has nothing to stream).
func (d *daemon) degradations(now time.Time) []degradation {
	if d.readyWarmer() == nil || d.changes == nil {
		return nil
	}
	return streamDegradations(d.changes.lease.Status().State, d.changes.stream.Status(), now)
}

// streamDegradations judges a change stream's status: role is the stream lease's state ("holder", "standby").
func streamDegradations(role string, st stream.Status, now time.Time) []degradation {
	var out []degradation
	for _, p := range st.Problems {
		out = append(out, degradation{checkStreamProblem, "change stream: " + p.String()})
	}
	if role != "holder" {
		return out
	}
	if st.State != "streaming" && now.Sub(st.Since) > streamStallAfter {
		why := ""
		if st.LastError != "" {
			why = ": " + st.LastError
		}
		out = append(out, degradation{checkStreamDown, fmt.Sprintf("change stream %s for %v (committed changes are not applied; keys follow their TTL)%s",
			st.State, now.Sub(st.Since).Round(time.Second), why)})
	}
	if st.LagSeconds > streamStallAfter.Seconds() {
		why := ""
		if st.LastError != "" {
			why = ": " + st.LastError
		}
		out = append(out, degradation{checkStreamStalled, fmt.Sprintf("change stream not advancing: the oldest of %d received transactions is %.0fs old and not applied%s",
			st.Pending, st.LagSeconds, why)})
	}
	return out
}

// degradedStrings is degradations as lines, for /readyz and the status page.
func (d *daemon) degradedStrings() []string {
	var out []string
	for _, g := range d.degradations(time.Now()) {
		out = append(out, g.Detail)
	}
	return out
}

// degradedCollector exports keepwarm_degraded{check}: the number of degradations of each check, read at scrape
// time (degradations does no I/O).
type degradedCollector struct {
	d    *daemon
	desc *prometheus.Desc
}

func newDegradedCollector(d *daemon) *degradedCollector {
	return &degradedCollector{d: d, desc: prometheus.NewDesc("keepwarm_degraded",
		"Parts of the job not being done while the daemon is ready, by check (stream_down, stream_stalled, stream_problem): should be 0. /readyz, the status page and keepwarm status name them.",
		[]string{"check"}, nil)}
}

func (c *degradedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *degradedCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[string]int{}
	for _, g := range c.d.degradations(time.Now()) {
		counts[g.Check]++
	}
	for _, k := range degradedChecks {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[k]), k)
	}
}
