package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// TestLivezIsNotReadyz runs the daemon on a private Redis and freezes it (SIGSTOP): /readyz must fail at once,
// naming redis and the 500 ms bound, while /livez stays 200, since the process and its scheduler are alive and
// the fail-safe is doing its job. keepwarm healthcheck (the container HEALTHCHECK) follows /livez. After the thaw
// /readyz is 200 again.
func TestLivezIsNotReadyz(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	redisSrv := testenv.PrivateFreezableRedis(t)
	f := newDaemonFixture(t)
	f.write(t, `"1"`, "")
	// KEEPWARM_REDIS_URL overrides the config's [redis] url (the daemon's environment overrides).
	t.Setenv("KEEPWARM_REDIS_URL", redisSrv.URL)
	logs, stop := startRun(t, f.path)
	addr := listenAddr(t, logs)
	get := func(path string) (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	testenv.EventuallyDiag(t, 10*time.Second, "/readyz 200", withLog(logs, func() bool { code, _ := get("/readyz"); return code == 200 }))
	if code, body := get("/livez"); code != 200 || body != "ok\n" {
		t.Fatalf("/livez before the freeze = %d %q, want 200 ok", code, body)
	}

	redisSrv.Freeze(t)
	// The stop is asynchronous to kill(2): a PING may still be answered just after it.
	var code int
	var body string
	testenv.EventuallyDiag(t, 10*time.Second, "/readyz 503 after the freeze", withLog(logs, func() bool { code, body = get("/readyz"); return code == 503 }))
	if want := "not ready: redis: no answer within 500ms: context deadline exceeded\n"; code != 503 || body != want {
		t.Errorf("/readyz with Redis frozen = %d %q, want 503 %q", code, body, want)
	}
	if code, body := get("/livez"); code != 200 || body != "ok\n" {
		t.Errorf("/livez with Redis frozen = %d %q, want 200 ok: a frozen dependency is not a dead keepwarm", code, body)
	}
	var out bytes.Buffer
	t.Setenv("KEEPWARM_DAEMON_LISTEN", addr)
	if err := run(context.Background(), []string{"healthcheck"}, &out, &out); err != nil {
		t.Errorf("keepwarm healthcheck with Redis frozen: %v\n%s", err, &out)
	}
	out.Reset()
	if err := run(context.Background(), []string{"healthcheck", "--path", "/readyz"}, &out, &out); err == nil ||
		!strings.Contains(err.Error(), "redis: no answer within 500ms") {
		t.Errorf("keepwarm healthcheck --path /readyz with Redis frozen: %v, want it to fail naming redis", err)
	}

	redisSrv.Thaw(t)
	testenv.EventuallyDiag(t, 20*time.Second, "/readyz 200 after the thaw", withLog(logs, func() bool { code, _ := get("/readyz"); return code == 200 }))
	if code := stop(); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0\n%s", code, logs)
	}
}

// TestRunWarnsWhenListeningBeyondLoopback: daemon.listen on all interfaces is logged as a warning; loopback is not.
func TestRunWarnsWhenListeningBeyondLoopback(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	for _, tc := range []struct {
		listen string
		warn   bool
	}{
		{"127.0.0.1:0", false},
		{"0.0.0.0:0", true},
	} {
		t.Run(tc.listen, func(t *testing.T) {
			f := newDaemonFixture(t)
			f.write(t, `"1"`, "")
			t.Setenv("KEEPWARM_DAEMON_LISTEN", tc.listen)
			logs, stop := startRun(t, f.path)
			listenAddr(t, logs) // the warning, if any, comes before "keepwarm running"
			if got := strings.Contains(logs.String(), "daemon.listen is not loopback"); got != tc.warn {
				t.Errorf("listen %s: warning logged = %v, want %v\n%s", tc.listen, got, tc.warn, logs)
			}
			if code := stop(); code != 0 {
				t.Errorf("exit code = %d\n%s", code, logs)
			}
		})
	}
}
