package benchload

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/warmer"
)

// NewRedis returns a client with its own connection pool of poolSize connections (0: go-redis's default; one
// "application process") for the Redis at url, and checks within 3 s that it answers. The error names
// `scripts/services up` when Redis is not reachable.
func NewRedis(ctx context.Context, url string, poolSize int) (*redis.Client, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("parse redis url: %w", err)
	}
	if poolSize > 0 {
		opt.PoolSize = poolSize
	}
	c := redis.NewClient(opt)
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("redis %s is not reachable (start it with `scripts/services up`): %w", opt.Addr, err)
	}
	return c, nil
}

// NewPool returns a PostgreSQL pool of at most maxConns connections (0: pgxpool's default) for url, with
// application_name keepwarm-bench, and checks within 5 s that it answers. The error names `scripts/services up`
// when PostgreSQL is not reachable.
func NewPool(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse postgres url: %w", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "keepwarm-bench"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres pool: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgresql is not reachable (start it with `scripts/services up`): %w", err)
	}
	return pool, nil
}

// InfoField returns one field of a Redis INFO reply ("" when it has none).
func InfoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// ModuleRoot finds the directory holding go.mod, starting at the working directory, so that default paths
// resolve the same way from the repo root, from a package directory (go test) and from CI's clone. Without a
// go.mod above it, it returns the working directory ("." when even that is unknown).
func ModuleRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return "."
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return dir
		}
	}
}

// Dur formats a duration compactly with 3 significant digits: "0", "850µs", "1.25ms", "12.5ms", "3.40s".
func Dur(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < time.Millisecond:
		return strconv.FormatFloat(float64(d)/1e3, 'f', 0, 64) + "µs"
	case d < 10*time.Millisecond:
		return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) + "ms"
	case d < time.Second:
		return strconv.FormatFloat(float64(d)/1e6, 'f', 1, 64) + "ms"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) + "s"
}

// Percentile returns the nearest-rank q-quantile of d (q in [0, 1]; 1 is the maximum), 0 for an empty d. It sorts
// a copy; d is left as it is.
func Percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// LoaderOf adapts a keyspace's Source, which fetches batches, to the lockstep.Loader of the apps' miss path,
// which loads one id: the id's value, or lockstep.ErrNotFound when the origin has no row.
func LoaderOf(src warmer.Source) lockstep.Loader {
	return func(ctx context.Context, id string) ([]byte, error) {
		vals, _, err := src.Fetch(ctx, []string{id})
		if err != nil {
			return nil, err
		}
		v, ok := vals[id]
		if !ok {
			return nil, lockstep.ErrNotFound
		}
		return v, nil
	}
}
