package main

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// commandCounter is a go-redis hook that counts the commands the daemon sends, each command of a pipeline
// once, by command name (a bounded set: the daemon's own code names them). A fleet's Redis cost is the sum of
// its replicas' counters; INFO commandstats cannot tell the daemons from the apps.
type commandCounter struct{ sent *prometheus.CounterVec }

// countRedisCommands adds keepwarm_redis_commands_total to rdb and reg.
func countRedisCommands(rdb redis.UniversalClient, reg prometheus.Registerer) error {
	h := commandCounter{sent: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "keepwarm_redis_commands_total",
		Help: "Redis commands sent by the daemon (each command of a pipeline once), by command name.",
	}, []string{"command"})}
	if err := reg.Register(h.sent); err != nil {
		return fmt.Errorf("register redis command counter: %w", err)
	}
	rdb.AddHook(h)
	return nil
}

func (h commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.sent.WithLabelValues(cmd.Name()).Inc()
		return next(ctx, cmd)
	}
}

func (h commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.sent.WithLabelValues(c.Name()).Inc()
		}
		return next(ctx, cmds)
	}
}
