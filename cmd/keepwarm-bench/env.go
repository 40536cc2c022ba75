package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/benchload"
	"github.com/keepwarm/keepwarm/warmer"
)

// Defaults match scripts/services; KEEPWARM_REDIS_URL and KEEPWARM_POSTGRES_URL override them, as in the tests.
const (
	defaultRedisURL    = "redis://127.0.0.1:16379/0"
	defaultPostgresURL = "postgres://keepwarm@127.0.0.1:15432/keepwarm?sslmode=disable"
)

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// services are the connection flags every benchmark subcommand shares.
type services struct {
	redisURL    string
	postgresURL string
	schema      string
}

func (s *services) flags(fs *flag.FlagSet) {
	fs.StringVar(&s.redisURL, "redis", envOr("KEEPWARM_REDIS_URL", defaultRedisURL), "Redis URL (default $KEEPWARM_REDIS_URL or scripts/services')")
	fs.StringVar(&s.postgresURL, "postgres", envOr("KEEPWARM_POSTGRES_URL", defaultPostgresURL), "PostgreSQL URL (default $KEEPWARM_POSTGRES_URL or scripts/services')")
	fs.StringVar(&s.schema, "schema", "kwbench", "PostgreSQL schema for the benchmark's tables (created if missing)")
}

// ident quotes a PostgreSQL identifier.
func ident(s string) string { return pgx.Identifier{s}.Sanitize() }

// machine describes where a benchmark ran; every result block starts with it.
type machine struct {
	CPUs     int    `json:"cpus"`
	CPUModel string `json:"cpu_model"`
	MemGiB   int    `json:"mem_gib"`
	Go       string `json:"go"`
	Redis    string `json:"redis"`
	Postgres string `json:"postgres"`
	LoadAvg  string `json:"loadavg"`
}

func describeMachine(ctx context.Context, rdb redis.UniversalClient, pool *pgxpool.Pool) machine {
	m := machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), CPUModel: cpuModel(), MemGiB: memGiB(), LoadAvg: loadAvg()}
	if rdb != nil {
		if info, err := rdb.Info(ctx, "server").Result(); err == nil {
			m.Redis = benchload.InfoField(info, "redis_version")
		}
	}
	if pool != nil {
		_ = pool.QueryRow(ctx, "show server_version").Scan(&m.Postgres)
	}
	return m
}

func (m machine) String() string {
	return fmt.Sprintf("machine: %d cores (%s), %d GiB, %s/%s, %s, Redis %s, PostgreSQL %s, load average %s",
		m.CPUs, m.CPUModel, m.MemGiB, runtime.GOOS, runtime.GOARCH, m.Go, m.Redis, m.Postgres, m.LoadAvg)
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

func memGiB() int {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return int((kb + 1<<19) >> 20)
		}
	}
	return 0
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// latencies collects read latencies; percentiles sort a copy.
type latencies []time.Duration

func (l latencies) summary() latencySummary {
	s := slices.Clone(l)
	slices.Sort(s)
	q := func(p float64) time.Duration {
		if len(s) == 0 {
			return 0
		}
		i := int(p*float64(len(s))+0.5) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return latencySummary{N: len(s), P50: q(.5), P99: q(.99), P999: q(.999), Max: q(1)}
}

// latencySummary holds nearest-rank percentiles.
type latencySummary struct {
	N    int           `json:"n"`
	P50  time.Duration `json:"p50_ns"`
	P99  time.Duration `json:"p99_ns"`
	P999 time.Duration `json:"p999_ns"`
	Max  time.Duration `json:"max_ns"`
}

// writeFile writes b to path, creating its directory; "" writes nothing.
func writeFile(path string, b []byte, stderr io.Writer) error {
	if path == "" {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %s\n", path)
	return nil
}

// startWarmer runs w until ctx ends or the returned stop is called; stop returns once Run has.
func startWarmer(ctx context.Context, w *warmer.Warmer) (stop func()) {
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(wctx)
	}()
	return func() {
		cancel()
		<-done
	}
}
