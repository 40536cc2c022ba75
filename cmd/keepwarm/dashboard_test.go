package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/warmer"
)

// dashboard is the Grafana dashboard that deploy/grafana/provisioning loads.
const dashboard = "../../deploy/grafana/keepwarm.json"

// recordingRegisterer remembers what is registered through it, so that the test can Describe vectors that
// have no children yet (those do not show in Gather).
type recordingRegisterer struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return r.Registerer.Register(c)
}

func (r *recordingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// daemonMetrics returns every metric name the daemon registers, built the way `keepwarm run` builds its
// registry: newRegistry (Go, process, build info), the reload counter (startDaemon), the warmer's metrics and
// the cron's.
func daemonMetrics(t *testing.T) map[string]bool {
	t.Helper()
	cfg, err := config.Load(demoConfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Daemon.Listen = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	d, err := startDaemon(ctx, demoConfig, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	_ = d.srv.Run(ctx) // releases the listener
	rec := &recordingRegisterer{Registerer: d.reg}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	w, err := warmer.New(rdb, warmer.Config{Registerer: rec})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := warmer.NewCron(w, nil, rec, nil); err != nil {
		t.Fatal(err)
	}

	names := map[string]bool{}
	descs := make(chan *prometheus.Desc, 1000)
	for _, c := range append(rec.collectors, d.reloads) {
		c.Describe(descs)
	}
	close(descs)
	for desc := range descs {
		if m := fqName.FindStringSubmatch(desc.String()); m != nil {
			names[m[1]] = true
		}
	}
	mfs, err := d.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	return names
}

// dashboardMetrics returns the metric names in every PromQL expression of the dashboard: panel targets and
// template variable queries.
func dashboardMetrics(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%s: %v", dashboard, err)
	}
	ident := regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	used := map[string][]string{} // metric → panel titles
	var walk func(v any, title string)
	walk = func(v any, title string) {
		switch v := v.(type) {
		case map[string]any:
			if s, ok := v["title"].(string); ok {
				title = s
			}
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "expr" || k == "definition" || k == "query") {
					for _, id := range ident.FindAllString(s, -1) {
						if strings.HasPrefix(id, "keepwarm_") || strings.HasPrefix(id, "go_") || strings.HasPrefix(id, "process_") {
							used[id] = append(used[id], title)
						}
					}
				}
				walk(x, title)
			}
		case []any:
			for _, x := range v {
				walk(x, title)
			}
		}
	}
	walk(doc, "")
	return used
}

// TestDashboardMetricsExist fails when the dashboard queries a metric that the daemon does not register, so that a
// rename cannot leave a panel silently empty.
func TestDashboardMetricsExist(t *testing.T) {
	// Serial: starts the daemon's parts on the demo config, whose keys and replication slot every run of that config shares.
	have := daemonMetrics(t)
	used := dashboardMetrics(t)
	if len(used) < 20 {
		t.Fatalf("found only %d metric names in %s: is the parser broken?", len(used), dashboard)
	}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for n := range used {
			if !yield(n) {
				return
			}
		}
	}) {
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if s, ok := strings.CutSuffix(name, suffix); ok && have[s] {
				base = s
			}
		}
		if !have[base] {
			t.Errorf("dashboard panels %q query %s, which the daemon does not register", used[name], name)
		}
	}
	// The metrics the issue names must be on the dashboard.
	for _, name := range []string{
		"keepwarm_warmer_refreshes_total", "keepwarm_warmer_hot_expired_total", "keepwarm_warmer_lead_time_seconds_bucket",
		"keepwarm_warmer_origin_queries_total", "keepwarm_warmer_origin_query_duration_seconds_bucket",
		"keepwarm_warmer_lock_acquisitions_total", "keepwarm_warmer_failsafe_extensions_total",
		"keepwarm_warmer_keys_tracked", "keepwarm_warmer_keys_hot", "keepwarm_schedule_runs_total",
		"keepwarm_schedule_last_run_timestamp_seconds", "keepwarm_schedule_keys_written_total",
		"keepwarm_config_reloads_total",
	} {
		if len(used[name]) == 0 {
			t.Errorf("the dashboard has no panel on %s", name)
		}
	}
}
