package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/assemble"
	"github.com/keepwarm/keepwarm/internal/benchload"
	"github.com/keepwarm/keepwarm/internal/config"
)

type changesFlags struct {
	config, daemon, svg, json string
	rate                      float64
	duration, settle          time.Duration
	workers, sampleEvery      int
	zipf                      float64
	verifyOnly, keep          bool
	moveEvery                 int
}

// runChanges is `keepwarm-bench changes`: it updates track rows at --rate per second (single-row transactions,
// ids Zipf-distributed like the load's), times how long a sample of them takes to land in Redis (commit to the
// new name in GET track:<id>), reads the daemon's metrics before and after, and then checks that every cached key
// of the fed keyspaces equals a fresh fetch from the origin.
func runChanges(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f changesFlags
	fs := flag.NewFlagSet("changes", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.config, "config", "config.toml", "keepwarm config file (its [postgres] dsn and [redis] are used)")
	fs.StringVar(&f.daemon, "daemon", "", "the daemon's HTTP address, for its metrics before and after ('' = none)")
	fs.Float64Var(&f.rate, "rate", 1000, "row updates per second")
	fs.DurationVar(&f.duration, "duration", 2*time.Minute, "how long to update")
	fs.DurationVar(&f.settle, "settle", 3*time.Second, "wait after the last update before verifying")
	fs.IntVar(&f.workers, "workers", 16, "connections issuing updates")
	fs.IntVar(&f.sampleEvery, "sample-every", 20, "time the landing of every Nth update of a cached track")
	fs.IntVar(&f.moveEvery, "move-every", 100, "every Nth update moves the track to another album (0: never)")
	fs.Float64Var(&f.zipf, "zipf", 1.1, "Zipf exponent of the updated track ids")
	fs.BoolVar(&f.verifyOnly, "verify-only", false, "only check cached keys against the origin")
	fs.BoolVar(&f.keep, "keep", false, "leave the updated names and albums in the track table (by default they are put back at the end)")
	fs.StringVar(&f.svg, "svg", "", "write the latency plot here")
	fs.StringVar(&f.json, "json", "", "write the report as JSON here")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg, err := config.Load(f.config)
	if err != nil {
		return err
	}
	rdb, err := assemble.Redis(ctx, cfg, 5*time.Second)
	if err != nil {
		return err
	}
	defer rdb.Close()
	pool, err := assemble.Postgres(ctx, cfg, 5*time.Second)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Updates go to the primary: [changes] dsn when set ([postgres] dsn may be a read replica).
	wpool := pool
	if cfg.Changes.DSN != "" {
		if wpool, err = benchload.NewPool(ctx, cfg.Changes.DSN, int32(f.workers)); err != nil {
			return err
		}
		defer wpool.Close()
	}
	var rep benchload.UpdateReport
	if !f.verifyOnly {
		if !f.keep {
			restore, err := snapshotTracks(ctx, wpool)
			if err != nil {
				return err
			}
			defer restore(stderr)
		}
		before := daemonMetrics(f.daemon)
		u := benchload.Updates{Rate: f.rate, Duration: f.duration, Workers: f.workers, SampleEvery: f.sampleEvery,
			MoveEvery: f.moveEvery, Zipf: f.zipf}
		if err := benchload.RunUpdates(ctx, u, cfg, rdb, wpool, &rep, stderr); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(f.settle):
		}
		rep.Metrics = diffMetrics(before, daemonMetrics(f.daemon))
	}
	if err := verifyCached(ctx, cfg, rdb, pool, &rep); err != nil {
		return err
	}
	printChanges(stdout, f, &rep)
	return writeResults(f.svg, f.json, &rep, changesSVG, stderr)
}

// snapshotTracks reads every track's name and album, and returns a function that writes back those that changed,
// in one transaction (so that the demo catalog is the one the tests and the README expect after a run; the
// change stream refreshes the cached keys it touches). It reports on w what it did.
func snapshotTracks(ctx context.Context, pool *pgxpool.Pool) (func(w io.Writer), error) {
	var ids, albums []int32
	var names []string
	rows, err := pool.Query(ctx, "select track_id, name, album_id from track")
	if err != nil {
		return nil, fmt.Errorf("read the track table before the updates: %w", err)
	}
	for rows.Next() {
		var id, album int32
		var name string
		if err := rows.Scan(&id, &name, &album); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read the track table before the updates: %w", err)
		}
		ids, names, albums = append(ids, id), append(names, name), append(albums, album)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the track table before the updates: %w", err)
	}
	return func(w io.Writer) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		tag, err := pool.Exec(ctx, `update track t set name = v.name, album_id = v.album_id
			from unnest($1::int[], $2::text[], $3::int[]) as v(id, name, album_id)
			where t.track_id = v.id and (t.name is distinct from v.name or t.album_id is distinct from v.album_id)`,
			ids, names, albums)
		if err != nil {
			fmt.Fprintf(w, "changes: could not put the tracks' names and albums back: %v (reload the demo: dropdb chinook, make demo-data)\n", err)
			return
		}
		fmt.Fprintf(w, "changes: put back the names and albums of %d tracks (--keep leaves them)\n", tag.RowsAffected())
	}, nil
}

// verifyCached compares every cached key of the fed keyspaces with a fresh fetch from the origin.
func verifyCached(ctx context.Context, cfg *config.Config, rdb redis.UniversalClient, pool *pgxpool.Pool, rep *benchload.UpdateReport) error {
	srcs, err := assemble.Sources(pool, cfg)
	if err != nil {
		return err
	}
	for _, ks := range cfg.Keyspaces {
		if len(ks.FedBy) == 0 {
			continue
		}
		prefix, _, _ := strings.Cut(ks.Key, "${id}")
		var ids []string
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			id := strings.TrimPrefix(iter.Val(), prefix)
			if !strings.Contains(id, ":") {
				ids = append(ids, id)
			}
		}
		if err := iter.Err(); err != nil {
			return err
		}
		for start := 0; start < len(ids); start += 100 {
			batch := ids[start:min(start+100, len(ids))]
			// Read the cache first, then the origin: a value refreshed in between is newer, never older.
			cached := make(map[string][]byte, len(batch))
			for _, id := range batch {
				if v, err := rdb.Get(ctx, prefix+id).Bytes(); err == nil {
					cached[id] = v
				}
			}
			values, _, err := srcs[ks.Name].Fetch(ctx, batch)
			if err != nil {
				return fmt.Errorf("fetch %s: %w", ks.Name, err)
			}
			for id, v := range cached {
				rep.Checked++
				if !bytes.Equal(v, values[id]) {
					rep.Mismatches++
					if len(rep.MismatchExamples) < 5 {
						rep.MismatchExamples = append(rep.MismatchExamples, fmt.Sprintf("%s%s: cached %.80q, origin %.80q", prefix, id, v, values[id]))
					}
				}
			}
		}
	}
	return nil
}

// daemonMetrics scrapes the daemon's /metrics into name{labels} → value (counters, gauges, histogram buckets).
func daemonMetrics(addr string) map[string]float64 {
	out := map[string]float64{}
	if addr == "" {
		return out
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "keepwarm_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

func diffMetrics(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if strings.Contains(k, "_bucket") && !strings.HasPrefix(k, "keepwarm_changes_commit_to_redis_seconds_bucket") {
			continue
		}
		if d := v - before[k]; d != 0 || strings.Contains(k, "hot_expired") {
			out[k] = d
		}
	}
	return out
}

func printChanges(w io.Writer, f changesFlags, rep *benchload.UpdateReport) {
	if !f.verifyOnly {
		fmt.Fprintf(w, "changes: %d track updates in %v: %.0f/s (target %.0f/s), %d failed\n", rep.Updates,
			rep.Duration.Round(time.Second), rep.Achieved, rep.Rate, rep.Errors)
		fmt.Fprintf(w, "commit to Redis (GET track:<id> no longer the old name: the new one, or the key gone), %d timed updates of cached tracks: p50 %v  p99 %v  max %v; %d went absent (expired or invalidated); %d still the old name after 5 s\n",
			rep.Samples, rep.P50.Round(time.Millisecond), rep.P99.Round(time.Millisecond), rep.Max.Round(time.Millisecond),
			rep.Absent, rep.Lost)
		keys := make([]string, 0, len(rep.Metrics))
		for k := range rep.Metrics {
			if strings.HasPrefix(k, "keepwarm_changes_") || strings.HasPrefix(k, "keepwarm_stream_") ||
				strings.HasPrefix(k, "keepwarm_warmer_hot_expired") || strings.HasPrefix(k, "keepwarm_warmer_refreshes_total") {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		if p50, p99, ok := histQuantiles(rep.Metrics, "keepwarm_changes_commit_to_redis_seconds"); ok {
			fmt.Fprintf(w, "daemon's commit-to-Redis histogram (every transaction, bucket upper bounds): p50 <= %gs, p99 <= %gs\n", p50, p99)
		}
		fmt.Fprintln(w, "daemon metrics, change over the run:")
		for _, k := range keys {
			if strings.Contains(k, "_bucket") {
				continue
			}
			fmt.Fprintf(w, "  %s %g\n", k, rep.Metrics[k])
		}
	}
	fmt.Fprintf(w, "verify: %d cached keys of the fed keyspaces compared with the origin: %d differ\n", rep.Checked, rep.Mismatches)
	for _, e := range rep.MismatchExamples {
		fmt.Fprintln(w, "  "+e)
	}
}

func changesSVG(rep *benchload.UpdateReport) []byte {
	var p50, p99 [][2]float64
	ymax := 100.0
	for _, w := range rep.Windows {
		p50 = append(p50, [2]float64{w.At, w.P50})
		p99 = append(p99, [2]float64{w.At, w.P99})
		ymax = max(ymax, w.P99*1.1)
	}
	title := fmt.Sprintf("commit to Redis, %.0f track updates/s: p50 %v, p99 %v (5 s windows)", rep.Achieved,
		rep.P50.Round(time.Millisecond), rep.P99.Round(time.Millisecond))
	return lineSVG(title, "seconds into the run", "milliseconds", 0, max(rep.Duration.Seconds(), 1), 0, ymax,
		[]svgSeries{{name: "p50", color: palette[0], pts: p50}, {name: "p99", color: palette[1], pts: p99}})
}

// histQuantiles returns the upper bounds of the buckets holding the p50 and p99 of histogram name in m (deltas of
// cumulative bucket counts, keyed name_bucket{le="x"}).
func histQuantiles(m map[string]float64, name string) (p50, p99 float64, ok bool) {
	type bucket struct{ le, n float64 }
	var bs []bucket
	for k, v := range m {
		rest, found := strings.CutPrefix(k, name+`_bucket{le="`)
		if !found {
			continue
		}
		le, err := strconv.ParseFloat(strings.TrimSuffix(rest, `"}`), 64)
		if err != nil {
			continue
		}
		bs = append(bs, bucket{le, v})
	}
	slices.SortFunc(bs, func(a, b bucket) int {
		switch {
		case a.le < b.le:
			return -1
		case a.le > b.le:
			return 1
		}
		return 0
	})
	if len(bs) == 0 || bs[len(bs)-1].n == 0 {
		return 0, 0, false
	}
	total := bs[len(bs)-1].n
	find := func(q float64) float64 {
		for _, b := range bs {
			if b.n >= q*total {
				return b.le
			}
		}
		return math.Inf(1)
	}
	return find(0.5), find(0.99), true
}
