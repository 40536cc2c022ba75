package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/keepwarm/keepwarm/internal/benchload"
	"github.com/redis/go-redis/v9"
)

// runWarmup is `keepwarm-bench warmup`: `keepwarm warmup --query` over a generated table of --rows rows of
// about 300 bytes of JSON, against (a) a naive warmer (one SELECT and one SETEX per key, in sequence) and (b)
// the machine's limits measured in the same run: redis-benchmark's pipelined SET and one streaming SELECT.
func runWarmup(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var svc services
	fs := flag.NewFlagSet("warmup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	svc.flags(fs)
	rows := fs.Int("rows", 1_000_000, "rows in the generated table (about 300 bytes of JSON each)")
	naiveN := fs.Int("naive-sample", 20_000, "keys the naive warmer writes (its rate is per key, so a sample suffices)")
	batch := fs.Int("batch-size", 1000, "batch_size of the benchmark keyspace")
	conc := fs.Int("concurrency", 4, "max_origin_concurrency of the benchmark keyspace")
	if err := parse(fs, args); err != nil {
		return err
	}
	rdb, err := benchload.NewRedis(ctx, svc.redisURL, 8)
	if err != nil {
		return err
	}
	defer rdb.Close()
	pool, err := benchload.NewPool(ctx, svc.postgresURL, 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	fmt.Fprintln(stdout, describeMachine(ctx, rdb, pool))
	table := ident(svc.schema) + ".warm_rows"
	if err := ensureWarmTable(ctx, pool, svc.schema, table, *rows, stderr); err != nil {
		return err
	}

	// (b) the limits: pipelined SET of 300-byte values, and one streaming SELECT of the whole table.
	setRate, err := redisSetLimit(ctx, svc.redisURL)
	if err != nil {
		return err
	}
	selRate, err := selectLimit(ctx, pool, table)
	if err != nil {
		return err
	}

	// keepwarm warmup --query, the real command, as a child process (for its peak RSS).
	bin, err := buildKeepwarm(ctx, stderr)
	if err != nil {
		return err
	}
	defer os.RemoveAll(filepath.Dir(bin))
	cfgPath := filepath.Join(filepath.Dir(bin), "warmbench.toml")
	if err := os.WriteFile(cfgPath, []byte(warmConfig(svc, table, *batch, *conc)), 0o600); err != nil {
		return err
	}
	if err := deleteKeys(ctx, rdb, "kwbench-warmup:*", "meta:kwbench-warmup:*"); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "warmup: keepwarm warmup --query over %d rows...\n", *rows)
	start := time.Now()
	cmd := exec.CommandContext(ctx, bin, "warmup", "--config", cfgPath, "--keyspace", "warmbench", "--query", "--name", "bench")
	out, err := cmd.CombinedOutput()
	kwTime := time.Since(start)
	if err != nil {
		return fmt.Errorf("keepwarm warmup: %w\n%s", err, out)
	}
	written := parseWritten(string(out))
	rss := int64(0)
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		rss = ru.Maxrss * 1024 // kilobytes on Linux
	}
	kwRate := float64(written) / kwTime.Seconds()

	// (a) the naive warmer over a sample.
	if err := deleteKeys(ctx, rdb, "kwbench-warmup:*", "meta:kwbench-warmup:*"); err != nil {
		return err
	}
	naiveRate, err := naiveWarm(ctx, rdb, pool, table, *naiveN)
	if err != nil {
		return err
	}
	if err := deleteKeys(ctx, rdb, "kwbench-warmup:*"); err != nil {
		return err
	}

	fmt.Fprintf(stdout, "\nwarmup of %d keys (%s, batch_size %d, max_origin_concurrency %d)\n\n", *rows, table, *batch, *conc)
	fmt.Fprintf(stdout, "  %-46s %12s  %s\n", "", "keys/s", "")
	fmt.Fprintf(stdout, "  %-46s %12.0f  %d keys in %v, peak RSS %.0f MB\n", "keepwarm warmup --query (token lock, pipelined)", kwRate, written, kwTime.Round(time.Millisecond), float64(rss)/1e6)
	fmt.Fprintf(stdout, "  %-46s %12.0f  sample of %d keys\n", "naive: SELECT + SETEX per key, sequential", naiveRate, *naiveN)
	fmt.Fprintf(stdout, "  %-46s %12.0f  redis-benchmark -P 64 -t set -d 300\n", "limit: Redis pipelined SET", setRate)
	fmt.Fprintf(stdout, "  %-46s %12.0f  rows/s streamed to the client\n", "limit: one SELECT of the whole table", selRate)
	fmt.Fprintf(stdout, "\n  %-40s %8s  %s\n", "target", "measured", "")
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	fmt.Fprintf(stdout, "  %-40s %7.1fx  %s\n", ">= 25x the naive warmer", kwRate/naiveRate, verdict(kwRate/naiveRate >= 25))
	fmt.Fprintf(stdout, "  %-40s %7.0f%%  %s\n", ">= 40% of the Redis pipelined-SET rate", 100*kwRate/setRate, verdict(kwRate/setRate >= 0.4))
	fmt.Fprintf(stdout, "  %-40s %6.0fMB  %s\n", "peak RSS < 300 MB", float64(rss)/1e6, verdict(rss > 0 && rss < 300e6))
	return nil
}

// ensureWarmTable creates schema.warm_rows with n rows (id text, body json of about 300 bytes) unless it
// already has exactly n.
func ensureWarmTable(ctx context.Context, pool *pgxpool.Pool, schema, table string, n int, log io.Writer) error {
	var have int64
	if err := pool.QueryRow(ctx, "select count(*) from "+table).Scan(&have); err == nil && have == int64(n) {
		return nil
	}
	fmt.Fprintf(log, "warmup: generating %s with %d rows...\n", table, n)
	for _, q := range []string{
		"create schema if not exists " + ident(schema),
		"drop table if exists " + table,
		"create table " + table + " (id text primary key, body json not null)",
		"insert into " + table + " select i::text, json_build_object('id', i, 'name', 'item ' || i, 'price', (i % 997) / 10.0, " +
			"'description', repeat(md5(i::text), 7)) from generate_series(1, " + strconv.Itoa(n) + ") i",
		"analyze " + table,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("generate %s: %w", table, err)
		}
	}
	return nil
}

func warmConfig(svc services, table string, batch, conc int) string {
	return fmt.Sprintf(`[redis]
url = %q
[postgres]
dsn = %q
max_conns = %d
statement_timeout = "30s"
[[keyspace]]
name = "warmbench"
key = "kwbench-warmup:${id}"
ttl = "1h"
lock_ttl = "60s"
batch_size = %d
max_origin_concurrency = %d
top_n = 0
max_value_bytes = 65536
query = 'select id, body from %s where id = any($1)'
ids_query = 'select id from %s'
`, svc.redisURL, svc.postgresURL, conc+2, batch, conc, table, table)
}

// buildKeepwarm builds cmd/keepwarm into a temporary directory.
func buildKeepwarm(ctx context.Context, log io.Writer) (string, error) {
	dir, err := os.MkdirTemp("", "kwbench")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "keepwarm")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/keepwarm")
	cmd.Dir = benchload.ModuleRoot()
	cmd.Stderr = log
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build keepwarm: %w", err)
	}
	return bin, nil
}

var writtenRE = regexp.MustCompile(`written (\d+)`)

func parseWritten(out string) int64 {
	m := writtenRE.FindStringSubmatch(out)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

// redisSetLimit runs redis-benchmark's pipelined SET of 300-byte values and returns its requests per second.
func redisSetLimit(ctx context.Context, url string) (float64, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return 0, err
	}
	host, port, _ := strings.Cut(opt.Addr, ":")
	out, err := exec.CommandContext(ctx, "redis-benchmark", "-h", host, "-p", port, "-P", "64", "-t", "set",
		"-d", "300", "-n", "1000000", "-q").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark (apt-get install redis-tools): %w\n%s", err, out)
	}
	m := regexp.MustCompile(`SET: ([\d.]+) requests per second`).FindStringSubmatch(string(out))
	if m == nil {
		return 0, fmt.Errorf("redis-benchmark: no SET rate in %q", out)
	}
	return strconv.ParseFloat(m[1], 64)
}

// selectLimit streams the whole table to the client once and returns rows per second.
func selectLimit(ctx context.Context, pool *pgxpool.Pool, table string) (float64, error) {
	start := time.Now()
	rows, err := pool.Query(ctx, "select id, body from "+table)
	if err != nil {
		return 0, err
	}
	n := 0
	for rows.Next() {
		_ = rows.RawValues()
		n++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// naiveWarm is what a hand-written warm-up script does: for each id, one SELECT, then one SETEX.
func naiveWarm(ctx context.Context, rdb *redis.Client, pool *pgxpool.Pool, table string, n int) (float64, error) {
	start := time.Now()
	for i := 1; i <= n; i++ {
		id := strconv.Itoa(i)
		var body []byte
		if err := pool.QueryRow(ctx, "select body::text from "+table+" where id = $1", id).Scan(&body); err != nil {
			return 0, fmt.Errorf("naive select %s: %w", id, err)
		}
		if err := rdb.Set(ctx, "kwbench-warmup:"+id, body, time.Hour).Err(); err != nil {
			return 0, err
		}
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// deleteKeys removes every key matching the patterns (SCAN + UNLINK, pipelined).
func deleteKeys(ctx context.Context, rdb *redis.Client, patterns ...string) error {
	for _, p := range patterns {
		iter := rdb.Scan(ctx, 0, p, 10000).Iterator()
		var batch []string
		flush := func() error {
			if len(batch) == 0 {
				return nil
			}
			err := rdb.Unlink(ctx, batch...).Err()
			batch = batch[:0]
			return err
		}
		for iter.Next(ctx) {
			batch = append(batch, iter.Val())
			if len(batch) == 5000 {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if err := errors.Join(iter.Err(), flush()); err != nil {
			return err
		}
	}
	return nil
}
