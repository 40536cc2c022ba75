package server_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keepwarm/keepwarm/internal/server"
)

// serve starts a Server on a free loopback port with cfg and returns its base URL; it stops on cleanup.
func serve(t *testing.T, cfg server.Config) string {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	cfg.Gatherer = prometheus.NewRegistry()
	s, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return "http://" + s.Addr()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestLivezAndReadyz(t *testing.T) {
	stalled := errors.New("scheduler stalled: last pass 31s ago")
	down := errors.Join(errors.New("redis: no answer within 500ms"), errors.New("postgres: connection refused"))
	for _, tc := range []struct {
		name     string
		cfg      server.Config
		path     string
		wantCode int
		wantBody string
	}{
		{"livez without a check", server.Config{}, "/livez", 200, "ok\n"},
		{"healthz is livez", server.Config{Live: func() error { return stalled }}, "/healthz", 503, "not alive: scheduler stalled: last pass 31s ago\n"},
		{"livez alive", server.Config{Live: func() error { return nil }}, "/livez", 200, "ok\n"},
		{"livez stalled", server.Config{Live: func() error { return stalled }}, "/livez", 503, "not alive: scheduler stalled: last pass 31s ago\n"},
		{"livez ignores readiness", server.Config{Ready: func(context.Context) error { return down }}, "/livez", 200, "ok\n"},
		{"readyz names every failing dependency", server.Config{Ready: func(context.Context) error { return down }}, "/readyz", 503,
			"not ready: redis: no answer within 500ms; postgres: connection refused\n"},
		{"readyz ready", server.Config{Ready: func(context.Context) error { return nil }}, "/readyz", 200, "ready\n"},
		// A check that would block forever is cut off by the handler's own deadline.
		{"readyz bounded", server.Config{Ready: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }}, "/readyz", 503,
			"not ready: context deadline exceeded\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := get(t, serve(t, tc.cfg)+tc.path)
			if code != tc.wantCode || body != tc.wantBody {
				t.Errorf("GET %s = %d %q, want %d %q", tc.path, code, body, tc.wantCode, tc.wantBody)
			}
			if !strings.HasSuffix(body, "\n") {
				t.Errorf("body %q does not end with a newline", body)
			}
		})
	}
}
