package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"
)

// redisLogger routes go-redis's own log lines (connection pool dial failures, hook errors; by default raw
// "pool.go:…" lines on standard error) through slog, so that every line the daemon writes is structured. They are
// logged at Warn with msg "go-redis" and go-redis's text under "detail".
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, "go-redis", "detail", strings.TrimSpace(fmt.Sprintf(format, v...)))
}

// routeRedisLogs makes log go-redis's logger. go-redis has one logger per process, so the last call wins.
func routeRedisLogs(log *slog.Logger) { redis.SetLogger(redisLogger{log: log}) }
