package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	_ "net/http/pprof"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/warmer"
)

// The fleet-scale scenario measures a fleet of warmers (in this process, each with its own cluster client and
// metrics) keeping H hot keys (pinned, or the top_n of the access set) warm on a Redis Cluster, with an in-memory Source so that PostgreSQL is not
// what is measured: refreshes per second per replica, CPU per 1,000 refreshes (the daemons' and Redis's), Redis
// commands per refresh, memory per hot key, the misses an outside count sees (Redis's expired_keys), and, when a
// replica joins and then leaves, the keys that move and the time until every hot key has exactly one owner again.
// It feeds the capacity model in docs/operations.md.

type fleetScaleConfig struct {
	addrs      []string
	hot        int
	ttl        time.Duration
	replicas   []int
	window     time.Duration
	valueBytes int
	batch      int
	notify     bool
	jsonPath   string
	cpuProfile string
	access     bool
	// prefix starts every key of the run ("fs" by the flag's default); with flush false the cluster is not flushed
	// and the run deletes its own keys instead (the smoke test shares the cluster with other tests).
	prefix string
	flush  bool
}

func runFleetScale(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c fleetScaleConfig
	fs := flag.NewFlagSet("fleet-scale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addrs := fs.String("cluster", envOr("KEEPWARM_REDIS_CLUSTER_ADDRS", "127.0.0.1:27001,127.0.0.1:27002,127.0.0.1:27003"), "seed addresses of the Redis Cluster (scripts/services up cluster starts one); with --flush, every key on it is deleted")
	fs.IntVar(&c.hot, "hot", 1_000_000, "hot keys (pinned ids 0..hot-1)")
	fs.DurationVar(&c.ttl, "ttl", 60*time.Second, "the keys' TTL (jitter 0.1 and refresh-ahead 20% of it, the shipped defaults)")
	replicas := fs.String("replicas", "3,5", "fleet sizes to measure, one after the other")
	fs.DurationVar(&c.window, "window", 2*time.Minute, "how long the steady state is measured, after the first fill and one TTL")
	fs.IntVar(&c.valueBytes, "value-bytes", 300, "value size written by the in-memory source")
	fs.IntVar(&c.batch, "batch-size", warmer.DefaultBatchSize, "the warmer's batch_size")
	fs.BoolVar(&c.notify, "notifications", true, "keyspace notifications on, as config.toml ships (sets notify-keyspace-events Exeg$ on every master and restores it after)")
	fs.StringVar(&c.jsonPath, "json", "", "write the results as JSON to this file")
	fs.BoolVar(&c.access, "access-set", false, "select the hot keys from the access sorted set (top_n = --hot, the ids ZADDed with falling scores) instead of pinning them: each replica then reads the top of the set every poll, as in production")
	fs.StringVar(&c.prefix, "prefix", "fs", "prefix of every key of the run")
	fs.BoolVar(&c.flush, "flush", true, "FLUSHALL every master before each fleet size (false: delete only the keys that contain --prefix, so pick one no other key contains; Redis's expired_keys then counts other clients' keys too)")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	pprofAddr := fs.String("pprof", "", "serve net/http/pprof on this address (e.g. 127.0.0.1:6061) while running")
	if err := parse(fs, args); err != nil {
		return err
	}
	for _, a := range strings.Split(*addrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			c.addrs = append(c.addrs, a)
		}
	}
	for _, s := range strings.Split(*replicas, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return usageError{fmt.Errorf("--replicas: %q is not a positive count", s)}
		}
		c.replicas = append(c.replicas, n)
	}
	switch {
	case len(c.addrs) == 0:
		return usageError{errors.New("--cluster: no address")}
	case c.hot < 1:
		return usageError{fmt.Errorf("--hot: %d is not a positive count", c.hot)}
	case c.ttl < 2*time.Second:
		return usageError{fmt.Errorf("--ttl: %v is below 2s (a refresh's 1 s statement timeout must fit in half the TTL)", c.ttl)}
	}
	if *pprofAddr != "" {
		go func() { _ = http.ListenAndServe(*pprofAddr, nil) }() // net/http/pprof's handlers
	}
	if c.cpuProfile != "" {
		f, err := os.Create(c.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	rep, err := fleetScale(ctx, c, stdout, stderr)
	if err != nil {
		return err
	}
	return writeResults("", c.jsonPath, rep, func(*fleetScaleReport) []byte { return nil }, stderr)
}

type fleetScaleReport struct {
	Machine machine         `json:"machine"`
	Hot     int             `json:"hot"`
	TTL     time.Duration   `json:"ttl_ns"`
	Access  bool            `json:"access_set"`
	Runs    []fleetScaleRun `json:"runs"`
}

type fleetScaleRun struct {
	Replicas int `json:"replicas"`
	// The first fill: every key absent, all due at once (the fleet's saturation throughput).
	FillSeconds float64 `json:"fill_s"`
	FillPerSec  float64 `json:"fill_keys_per_s"`
	// The steady state, over Window after the fill and one TTL.
	Window            float64    `json:"window_s"`
	Refreshes         int64      `json:"refreshes"`
	PerReplicaPerSec  []float64  `json:"refreshes_per_s_by_replica"`
	CPUPer1000        float64    `json:"daemon_cpu_s_per_1000_refreshes"` // every replica's, this process's rusage
	RedisCPUPer1000   float64    `json:"redis_cpu_s_per_1000_refreshes"`  // the masters' used_cpu_user+sys
	CommandsPerRefr   float64    `json:"commands_per_refresh"`            // sent by the replicas (hooks)
	RoundTripsPerRefr float64    `json:"round_trips_per_refresh"`
	ServerCallsPerRef float64    `json:"server_calls_per_refresh"` // INFO commandstats over the masters
	ExpiredKeys       int64      `json:"expired_keys"`             // Redis's own count over the masters: misses
	HotExpired        int64      `json:"hot_expired"`              // the replicas' SLO counters
	OwnerChanges      int64      `json:"ownership_changes"`        // keepwarm_warmer_fleet_ownership_changes_total over the replicas: membership flaps
	HeapPerHotKey     float64    `json:"heap_bytes_per_hot_key_per_replica"`
	RSSPerHotKey      float64    `json:"rss_bytes_per_hot_key_per_replica"`
	RedisBytesPerKey  float64    `json:"redis_used_memory_bytes_per_key"` // masters' used_memory / keys
	Join              *rebalance `json:"join"`
	Leave             *rebalance `json:"leave"`
}

type rebalance struct {
	Seconds  float64 `json:"seconds"`    // from the change until every hot key has exactly one owner of the new membership
	Moved    int     `json:"keys_moved"` // hot keys whose owner changed
	Fraction float64 `json:"fraction"`   // Moved / hot
	Expected float64 `json:"expected"`   // 1/(members after a join) or 1/(members before a leave)
	Expired  int64   `json:"expired_keys"`
}

// scaleReplica is one warmer of the fleet, with its own cluster client, command hook and metrics registry.
type scaleReplica struct {
	id   string
	rdb  *redis.ClusterClient
	hook *cmdCounter
	reg  *prometheus.Registry
	w    *warmer.Warmer
	stop func()
}

func fleetScale(ctx context.Context, c fleetScaleConfig, stdout, stderr io.Writer) (*fleetScaleReport, error) {
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.addrs, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second})
	defer admin.Close()
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	err := admin.ForEachMaster(pctx, func(ctx context.Context, m *redis.Client) error { return m.Ping(ctx).Err() })
	cancel()
	if err != nil {
		return nil, fmt.Errorf("redis cluster %v is not reachable (start it with `scripts/services up cluster`): %w", c.addrs, err)
	}
	if c.notify {
		restore, err := setMastersConfig(ctx, admin, "notify-keyspace-events", "Exeg$")
		if err != nil {
			return nil, err
		}
		defer restore()
	}
	rep := &fleetScaleReport{Machine: describeMachine(ctx, admin, nil), Hot: c.hot, TTL: c.ttl, Access: c.access}
	fmt.Fprintln(stdout, rep.Machine, "(PostgreSQL not used: the Source is in memory)")
	for _, n := range c.replicas {
		run, err := fleetScaleOne(ctx, c, admin, n, stderr)
		if err != nil {
			return nil, fmt.Errorf("%d replicas: %w", n, err)
		}
		rep.Runs = append(rep.Runs, *run)
	}
	printFleetScale(stdout, rep)
	return rep, nil
}

// setMastersConfig sets a config parameter on every master and returns a function that restores each one's value.
func setMastersConfig(ctx context.Context, admin *redis.ClusterClient, param, value string) (restore func(), err error) {
	var mu sync.Mutex
	old := map[string]string{}
	err = admin.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		v, err := m.ConfigGet(ctx, param).Result()
		if err != nil {
			return err
		}
		mu.Lock()
		old[m.Options().Addr] = v[param]
		mu.Unlock()
		return m.ConfigSet(ctx, param, value).Err()
	})
	return func() {
		_ = admin.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
			mu.Lock()
			v, ok := old[m.Options().Addr]
			mu.Unlock()
			if !ok {
				return nil
			}
			return m.ConfigSet(ctx, param, v).Err()
		})
	}, err
}

// mastersInfo sums numeric INFO fields over the masters; section is INFO's argument.
func mastersInfo(ctx context.Context, admin *redis.ClusterClient, section string, fields ...string) (map[string]float64, error) {
	var mu sync.Mutex
	out := map[string]float64{}
	err := admin.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		info, err := m.Info(ctx, section).Result()
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, line := range strings.Split(info, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok {
				continue
			}
			if section == "commandstats" {
				if num, _, ok := strings.Cut(strings.TrimPrefix(v, "calls="), ","); ok && strings.HasPrefix(v, "calls=") {
					if n, err := strconv.ParseFloat(num, 64); err == nil && k != "cmdstat_info" {
						out["calls"] += n
					}
				}
				continue
			}
			for _, f := range fields {
				if k == f {
					if n, err := strconv.ParseFloat(v, 64); err == nil {
						out[f] += n
					}
				}
			}
		}
		return nil
	})
	return out, err
}

func mastersKeys(ctx context.Context, admin *redis.ClusterClient) (int64, error) {
	var mu sync.Mutex
	var n int64
	err := admin.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		k, err := m.DBSize(ctx).Result()
		mu.Lock()
		n += k
		mu.Unlock()
		return err
	})
	return n, err
}

// gauge sums the samples of the metric family name in reg (counters and gauges), whatever their labels, or
// only those whose label result has the value given.
func gauge(reg *prometheus.Registry, name, result string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if result != "" && labelOf(m, "result") != result {
				continue
			}
			switch {
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			}
		}
	}
	return sum
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func (c fleetScaleConfig) keyspace(src warmer.Source, ids []string) warmer.KeyspaceConfig {
	keys, err := lockstep.NewKeys(c.prefix+":{${id}}", "", "", "")
	if err != nil {
		panic(err) // a constant template: programmer error
	}
	ks := warmer.KeyspaceConfig{Name: "fleetscale", AccessKey: c.prefix + ":access", Keys: keys, Src: src, TTL: c.ttl, Jitter: lockstep.DefaultJitter,
		BatchSize: c.batch, StatementTimeout: time.Second} // the Source answers from memory: 1 s bounds it with room
	if c.access {
		ks.TopN, ks.DecayHalfLife = len(ids), time.Hour
	} else {
		ks.Pinned = ids
	}
	return ks
}

func startScaleReplica(ctx context.Context, c fleetScaleConfig, id string, src warmer.Source, ids []string) (*scaleReplica, error) {
	r := &scaleReplica{id: id, hook: newCmdCounter(), reg: prometheus.NewRegistry()}
	r.rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.addrs, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second})
	r.rdb.AddHook(r.hook)
	var err error
	r.w, err = warmer.New(r.rdb, warmer.Config{Logger: slog.New(slog.DiscardHandler), Notifications: c.notify, Registerer: r.reg,
		Keyspaces: []warmer.KeyspaceConfig{c.keyspace(src, ids)},
		Fleet:     warmer.FleetConfig{Key: fmt.Sprintf("keepwarm:fleet:%s:%d", c.prefix, os.Getpid()), ReplicaID: id}})
	if err != nil {
		r.rdb.Close()
		return nil, err
	}
	r.stop = startWarmer(ctx, r.w)
	return r, nil
}

func (r *scaleReplica) close() {
	r.stop()
	r.rdb.Close()
}

func (r *scaleReplica) owned() int { return int(gauge(r.reg, "keepwarm_warmer_keys_owned", "")) }
func (r *scaleReplica) ok() int64 {
	return int64(gauge(r.reg, "keepwarm_warmer_refreshes_total", warmer.ResultOK))
}

// owners returns, for each hot id 0..hot-1, the index of the replica that owns it, -1 for none and -2 for
// more than one (read from each replica's Status).
func owners(reps []*scaleReplica, hot int) []int8 {
	out := make([]int8, hot)
	for i := range out {
		out[i] = -1
	}
	for ri, r := range reps {
		for _, st := range r.w.Status(0) {
			for _, k := range st.Keys {
				n, err := strconv.Atoi(k.ID)
				if err != nil || n < 0 || n >= hot || !k.Owned {
					continue
				}
				if out[n] == -1 {
					out[n] = int8(ri)
				} else {
					out[n] = -2
				}
			}
		}
	}
	return out
}

// settled reports whether every replica sees want members and the owned counts sum to hot.
func settled(reps []*scaleReplica, want, hot int) bool {
	sum := 0
	for _, r := range reps {
		if len(r.w.Fleet().Members) != want {
			return false
		}
		sum += r.owned()
	}
	return sum == hot
}

func fleetScaleOne(ctx context.Context, c fleetScaleConfig, admin *redis.ClusterClient, n int, stderr io.Writer) (*fleetScaleRun, error) {
	if err := clearRun(ctx, c, admin); err != nil {
		return nil, err
	}
	defer func() { _ = clearRun(context.WithoutCancel(ctx), c, admin) }()
	ids := make([]string, c.hot)
	for i := range ids {
		ids[i] = strconv.Itoa(i)
	}
	if c.access {
		access := c.prefix + ":access"
		for start := 0; start < len(ids); start += 10000 {
			zs := make([]redis.Z, 0, 10000)
			for i := start; i < min(start+10000, len(ids)); i++ {
				zs = append(zs, redis.Z{Score: float64(len(ids) - i), Member: ids[i]})
			}
			if err := admin.ZAdd(ctx, access, zs...).Err(); err != nil {
				return nil, err
			}
		}
	}
	src := newMemSource(c.valueBytes)
	h0, rss0 := memNow()
	fmt.Fprintf(stderr, "fleet-scale: %d replicas, %d hot keys, TTL %v\n", n, c.hot, c.ttl)
	var reps []*scaleReplica
	defer func() {
		for _, r := range reps {
			r.close()
		}
	}()
	start := time.Now()
	for i := range n {
		r, err := startScaleReplica(ctx, c, fmt.Sprintf("r%d", i), src, ids)
		if err != nil {
			return nil, err
		}
		reps = append(reps, r)
	}
	sumOK := func() int64 {
		var s int64
		for _, r := range reps {
			s += r.ok()
		}
		return s
	}
	for sumOK() < int64(c.hot) {
		if time.Since(start) > 10*time.Minute || ctx.Err() != nil {
			return nil, fmt.Errorf("first fill: %d of %d refreshed after %v", sumOK(), c.hot, time.Since(start))
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
	fill := time.Since(start)
	run := &fleetScaleRun{Replicas: n, FillSeconds: fill.Seconds(), FillPerSec: float64(c.hot) / fill.Seconds()}
	fmt.Fprintf(stderr, "fleet-scale: first fill in %.1fs (%.0f keys/s); steady state after one TTL, for %v\n", fill.Seconds(), run.FillPerSec, c.window)
	if !sleepCtx(ctx, c.ttl) {
		return nil, ctx.Err()
	}

	// The steady window.
	s0, err := sampleFleet(ctx, reps, admin)
	if err != nil {
		return nil, err
	}
	if !sleepCtx(ctx, c.window) {
		return nil, ctx.Err()
	}
	s1, err := sampleFleet(ctx, reps, admin)
	if err != nil {
		return nil, err
	}
	win := s1.at.Sub(s0.at)
	for i := range reps {
		d := s1.ok[i] - s0.ok[i]
		run.Refreshes += d
		run.PerReplicaPerSec = append(run.PerReplicaPerSec, float64(d)/win.Seconds())
	}
	k := float64(max(run.Refreshes, 1))
	run.Window = win.Seconds()
	run.CPUPer1000 = 1000 * (s1.cpu - s0.cpu).Seconds() / k
	run.RedisCPUPer1000 = 1000 * (s1.redisCPU - s0.redisCPU) / k
	run.CommandsPerRefr = float64(s1.cmds-s0.cmds) / k
	run.RoundTripsPerRefr = float64(s1.trips-s0.trips) / k
	run.ServerCallsPerRef = (s1.calls - s0.calls) / k
	run.ExpiredKeys = int64(s1.expired - s0.expired)
	run.HotExpired = s1.hot - s0.hot
	run.OwnerChanges = s1.changes - s0.changes
	h1, rss1 := memNow()
	run.HeapPerHotKey = float64(h1-h0) / float64(n) / float64(c.hot)
	run.RSSPerHotKey = float64(rss1-rss0) / float64(n) / float64(c.hot)
	if mem, err := mastersInfo(ctx, admin, "memory", "used_memory"); err == nil {
		if keys, err := mastersKeys(ctx, admin); err == nil && keys > 0 {
			run.RedisBytesPerKey = mem["used_memory"] / float64(keys)
		}
	}
	fmt.Fprintf(stderr, "fleet-scale: steady: %d refreshes in %.0fs, %d keys expired\n", run.Refreshes, run.Window, run.ExpiredKeys)

	// A replica joins, then leaves cleanly.
	before := owners(reps, c.hot)
	e0, _ := mastersInfo(ctx, admin, "stats", "expired_keys")
	t0 := time.Now()
	joiner, err := startScaleReplica(ctx, c, fmt.Sprintf("r%d", n), src, ids)
	if err != nil {
		return nil, err
	}
	reps = append(reps, joiner)
	if run.Join, err = awaitRebalance(ctx, reps, n+1, c.hot, t0, before, admin, e0); err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	fmt.Fprintf(stderr, "fleet-scale: join: %d keys moved (%.3f), settled in %.1fs\n", run.Join.Moved, run.Join.Fraction, run.Join.Seconds)
	before = owners(reps, c.hot)
	e0, _ = mastersInfo(ctx, admin, "stats", "expired_keys")
	t0 = time.Now()
	joiner.close()
	reps = reps[:n]
	for i, o := range before {
		if int(o) == n {
			before[i] = -3 // the leaver's: each of them moves
		}
	}
	if run.Leave, err = awaitRebalance(ctx, reps, n, c.hot, t0, before, admin, e0); err != nil {
		return nil, fmt.Errorf("leave: %w", err)
	}
	run.Leave.Expected = 1 / float64(n+1)
	fmt.Fprintf(stderr, "fleet-scale: leave: %d keys moved (%.3f), settled in %.1fs\n", run.Leave.Moved, run.Leave.Fraction, run.Leave.Seconds)
	return run, nil
}

// fleetSample is what the steady window's figures are differences of: each replica's ok refreshes, the
// replicas' commands, round trips, SLO counts and ownership changes summed, the masters' expired keys, CPU
// seconds and command calls summed, and this process's CPU time.
type fleetSample struct {
	at                        time.Time
	ok                        []int64
	cmds, trips, hot, changes int64
	expired, redisCPU, calls  float64
	cpu                       time.Duration
}

func sampleFleet(ctx context.Context, reps []*scaleReplica, admin *redis.ClusterClient) (fleetSample, error) {
	s := fleetSample{at: time.Now(), cpu: cpuTime()}
	for _, r := range reps {
		s.ok = append(s.ok, r.ok())
		cmds, trips, _ := r.hook.snapshot()
		s.cmds += cmds
		s.trips += trips
		s.hot += int64(gauge(r.reg, "keepwarm_warmer_hot_expired_total", ""))
		s.changes += int64(gauge(r.reg, "keepwarm_warmer_fleet_ownership_changes_total", ""))
	}
	st, err := mastersInfo(ctx, admin, "stats", "expired_keys")
	if err != nil {
		return s, err
	}
	cpu, err := mastersInfo(ctx, admin, "cpu", "used_cpu_user", "used_cpu_sys")
	if err != nil {
		return s, err
	}
	cs, err := mastersInfo(ctx, admin, "commandstats")
	s.expired, s.redisCPU, s.calls = st["expired_keys"], cpu["used_cpu_user"]+cpu["used_cpu_sys"], cs["calls"]
	return s, err
}

// clearRun empties the cluster (flush) or deletes the run's own keys (prefix:*), on every master.
func clearRun(ctx context.Context, c fleetScaleConfig, admin *redis.ClusterClient) error {
	return admin.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		if c.flush {
			return m.FlushAll(ctx).Err()
		}
		// The values, their locks, the access set, the fleet key and its miss claims all contain the prefix.
		it := m.Scan(ctx, 0, "*"+c.prefix+"*", 1000).Iterator()
		for it.Next(ctx) {
			if err := m.Del(ctx, it.Val()).Err(); err != nil {
				return err
			}
		}
		return it.Err()
	})
}

// awaitRebalance waits until every replica in reps sees want members and the owned counts sum to hot, then
// counts the keys whose owner differs from before.
func awaitRebalance(ctx context.Context, reps []*scaleReplica, want, hot int, t0 time.Time, before []int8, admin *redis.ClusterClient, e0 map[string]float64) (*rebalance, error) {
	for !settled(reps, want, hot) {
		if time.Since(t0) > 2*time.Minute || ctx.Err() != nil {
			return nil, fmt.Errorf("not settled after %v", time.Since(t0))
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
	took := time.Since(t0)
	after := owners(reps, hot)
	moved := 0
	for i := range after {
		if after[i] != before[i] {
			moved++
		}
	}
	e1, _ := mastersInfo(ctx, admin, "stats", "expired_keys")
	return &rebalance{Seconds: took.Seconds(), Moved: moved, Fraction: float64(moved) / float64(hot),
		Expected: 1 / float64(want), Expired: int64(e1["expired_keys"] - e0["expired_keys"])}, nil
}

func printFleetScale(w io.Writer, rep *fleetScaleReport) {
	how := "pinned"
	if rep.Access {
		how = "access-set (top_n)"
	}
	fmt.Fprintf(w, "\n%d %s hot keys, TTL %v, jitter 0.1, refresh-ahead 20%%: each key is refreshed every TTL×1.05 − lead = 0.85 TTL, so the fleet needs about %.0f refreshes/s\n", rep.Hot, how, rep.TTL, float64(rep.Hot)/(0.85*rep.TTL.Seconds()))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "replicas\tfirst fill keys/s\trefreshes/s per replica\tdaemon CPU s/1000\tRedis CPU s/1000\tcmds/refresh\tround trips/refresh\tserver calls/refresh\texpired (misses)\tSLO counter\towner changes\theap B/hot key/replica\tRSS B/hot key/replica\tRedis B/key\t")
	for _, r := range rep.Runs {
		var per []string
		for _, p := range r.PerReplicaPerSec {
			per = append(per, fmt.Sprintf("%.0f", p))
		}
		fmt.Fprintf(tw, "%d\t%.0f\t%s\t%.3f\t%.3f\t%.2f\t%.3f\t%.2f\t%d\t%d\t%d\t%.0f\t%.0f\t%.0f\t\n", r.Replicas, r.FillPerSec, strings.Join(per, " "),
			r.CPUPer1000, r.RedisCPUPer1000, r.CommandsPerRefr, r.RoundTripsPerRefr, r.ServerCallsPerRef, r.ExpiredKeys, r.HotExpired, r.OwnerChanges,
			r.HeapPerHotKey, r.RSSPerHotKey, r.RedisBytesPerKey)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "\nmembership changes (keys moved: owner differs before and after; settled: every replica sees the new members and owned counts sum to the hot set):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "replicas\tchange\tkeys moved\tfraction\texpected\tsettled in\texpired meanwhile\t")
	for _, r := range rep.Runs {
		for _, ch := range []struct {
			name string
			b    *rebalance
		}{{fmt.Sprintf("%d→%d (join)", r.Replicas, r.Replicas+1), r.Join}, {fmt.Sprintf("%d→%d (leave)", r.Replicas+1, r.Replicas), r.Leave}} {
			if ch.b == nil {
				continue
			}
			fmt.Fprintf(tw, "%d\t%s\t%d\t%.3f\t%.3f\t%.1fs\t%d\t\n", r.Replicas, ch.name, ch.b.Moved, ch.b.Fraction, ch.b.Expected, ch.b.Seconds, ch.b.Expired)
		}
	}
	_ = tw.Flush()
}
