// Package assemble builds the daemon's parts from a loaded config: the Redis client, the PostgreSQL pool, one
// source per keyspace, and the warmer's keyspace configs. keepwarm's commands and keepwarm-bench share it so that
// they connect and translate the config in exactly one way.
package assemble

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/sources/postgres"
	"github.com/keepwarm/keepwarm/warmer"
)

// Redis returns a client for the [redis] section (single, Sentinel or Cluster) and checks that it answers
// within timeout. In cluster mode it also checks every keyspace's templates keep one id's keys in one slot.
func Redis(ctx context.Context, cfg *config.Config, timeout time.Duration) (redis.UniversalClient, error) {
	opts, err := cfg.RedisOptions()
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	rdb := redis.NewUniversalClient(opts)
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		_ = rdb.Close()
		where := cfg.Redis.RedactedURL()
		if where == "" {
			where = strings.Join(cfg.Redis.Addresses, ",")
		}
		if strings.Contains(err.Error(), "DB index is out of range") {
			return nil, fmt.Errorf("redis %s: db %d: the server has fewer databases (its `databases` setting): %w", where, cfg.Redis.DB, err)
		}
		return nil, fmt.Errorf("redis %s: %w", where, err)
	}
	return rdb, nil
}

// Postgres returns a pool for the [postgres] section and checks that it answers within timeout.
func Postgres(ctx context.Context, cfg *config.Config, timeout time.Duration) (*pgxpool.Pool, error) {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pool, err := postgres.NewPool(pctx, cfg.Postgres.DSN, cfg.Postgres.MaxConns, cfg.Postgres.ConnectTimeout)
	if err != nil {
		return nil, fmt.Errorf("postgres %s: %w", cfg.Postgres.RedactedDSN(), err)
	}
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres %s: %w", cfg.Postgres.RedactedDSN(), err)
	}
	return pool, nil
}

// Sources returns one PostgreSQL source per keyspace, by name. opts (postgres.WithRegisterer) apply to each.
func Sources(pool *pgxpool.Pool, cfg *config.Config, opts ...postgres.Option) (map[string]*postgres.Source, error) {
	out := make(map[string]*postgres.Source, len(cfg.Keyspaces))
	var errs []error
	for _, ks := range cfg.Keyspaces {
		src, err := postgres.New(pool, postgres.Config{Keyspace: ks.Name, Query: ks.Query, IDsQuery: ks.IDsQuery,
			StatementTimeout: cfg.Postgres.StatementTimeout, PoolWaitTimeout: cfg.Postgres.PoolWaitTimeout}, opts...)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[ks.Name] = src
	}
	return out, errors.Join(errs...)
}

// Keyspaces translates the config's keyspaces into the warmer's, with their pinned ids and sources.
func Keyspaces(cfg *config.Config, sources map[string]*postgres.Source) []warmer.KeyspaceConfig {
	out := make([]warmer.KeyspaceConfig, 0, len(cfg.Keyspaces))
	for _, ks := range cfg.Keyspaces {
		out = append(out, Keyspace(cfg, ks, sources[ks.Name]))
	}
	return out
}

// Keyspace translates one keyspace (config.Config.WarmerKeyspace, which Load also checks with warmer's Resolve).
func Keyspace(cfg *config.Config, ks *config.Keyspace, src warmer.Source) warmer.KeyspaceConfig {
	return cfg.WarmerKeyspace(ks, src)
}

// Schedules translates the config's [[schedule]] entries into the warmer's, with their ids: inline, a
// [[hotkeys]] list's, or the keyspace's ids_query (streamed from its source at each run).
func Schedules(cfg *config.Config, sources map[string]*postgres.Source) []warmer.ScheduleConfig {
	out := make([]warmer.ScheduleConfig, 0, len(cfg.Schedules))
	for _, s := range cfg.Schedules {
		sc := warmer.ScheduleConfig{Name: s.Name, Spec: s.CronSpec(), Cron: s.Spec(), Keyspace: s.Keyspace,
			Spread: s.Spread, Rate: s.Rate, SkipDSTGap: s.DSTGap == config.DSTGapSkip}
		switch {
		case s.IDsQuery:
			if src := sources[s.Keyspace]; src != nil {
				sc.IDs = src.IDs
			}
		case s.List != "":
			if h := cfg.HotkeysList(s.List); h != nil {
				sc.IDs = warmer.SliceIDs(h.IDs)
			}
		default:
			sc.IDs = warmer.SliceIDs(s.IDs)
		}
		out = append(out, sc)
	}
	return out
}

// Fleet translates the [fleet] section into the warmer's FleetConfig: the zero value when sharing is off, and
// by default a member set named after the keyspaces' cache-key templates.
func Fleet(cfg *config.Config) warmer.FleetConfig {
	f := cfg.Fleet
	if !f.Enabled {
		return warmer.FleetConfig{}
	}
	key := f.Key
	if key == "" {
		templates := make([]string, 0, len(cfg.Keyspaces))
		for _, ks := range cfg.Keyspaces {
			templates = append(templates, ks.Key)
		}
		key = warmer.DefaultFleetKey(templates)
	}
	return warmer.FleetConfig{Key: key, ReplicaID: f.ReplicaID, HeartbeatInterval: f.HeartbeatInterval,
		HeartbeatTTL: f.HeartbeatTTL}
}
