package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHealthcheck(t *testing.T) {
	t.Parallel()
	ready := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ready\n"))
	}))
	defer ready.Close()
	starting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("not ready: starting: waiting for redis and postgres\n"))
	}))
	defer starting.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()

	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
	}{
		{"ready", []string{"--url", ready.URL + "/readyz"}, 0, "ready"},
		{"not ready", []string{"--url", starting.URL + "/readyz"}, 1, "503 Service Unavailable: not ready: starting"},
		{"nobody listening", []string{"--url", closed.URL + "/readyz"}, 1, "connection refused"},
		{"stray argument", []string{"now"}, 2, `unexpected argument "now"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(context.Background(), append([]string{"healthcheck"}, tc.args...), &out, &out)
			if code := exitCode(err, &out); code != tc.wantCode {
				t.Errorf("exit code = %d, want %d; output:\n%s", code, tc.wantCode, &out)
			}
			if !strings.Contains(out.String(), tc.wantOut) {
				t.Errorf("output = %q, want it to contain %q", &out, tc.wantOut)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"version"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "keepwarm "+version+" (go"; !strings.HasPrefix(got, want) {
		t.Errorf("version printed %q, want prefix %q", got, want)
	}
}

func TestHealthcheckURL(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	for _, tc := range []struct {
		listen, path, want string
	}{
		{"", "/livez", "http://127.0.0.1:9471/livez"},
		{"0.0.0.0:9471", "/livez", "http://127.0.0.1:9471/livez"},
		{":9500", "/readyz", "http://127.0.0.1:9500/readyz"},
		{"[::]:9471", "/livez", "http://127.0.0.1:9471/livez"},
		{"10.0.0.7:9471", "/livez", "http://10.0.0.7:9471/livez"},
		{"[::1]:9471", "/livez", "http://[::1]:9471/livez"},
	} {
		t.Run(tc.listen, func(t *testing.T) {
			t.Setenv("KEEPWARM_DAEMON_LISTEN", tc.listen)
			if got := healthURL(tc.path); got != tc.want {
				t.Errorf("healthURL(%q) with KEEPWARM_DAEMON_LISTEN=%q = %q, want %q", tc.path, tc.listen, got, tc.want)
			}
		})
	}
}
