package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestRedisLogsAreStructured: with routeRedisLogs, go-redis's own "failed to dial" line comes out as a JSON slog
// record, not a raw "pool.go:…" line.
func TestRedisLogsAreStructured(t *testing.T) {
	// Serial: sets go-redis's process-wide logger.
	var buf syncBuffer
	routeRedisLogs(slog.New(slog.NewJSONHandler(&buf, nil)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nobody listens there now: every dial is refused
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING to a closed port succeeded")
	}
	var found bool
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("go-redis wrote a line that is not a JSON slog record: %q", line)
			continue
		}
		if rec["msg"] == "go-redis" && strings.Contains(rec["detail"].(string), "failed to dial") {
			found = true
		}
	}
	if !found {
		t.Errorf("no go-redis dial failure logged through slog; got:\n%s", &buf)
	}
}
