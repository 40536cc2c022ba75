package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/keepwarm/keepwarm/internal/server"
)

// healthURL is the URL `keepwarm healthcheck` checks without --url: path on the daemon's listen address, taken
// from $KEEPWARM_DAEMON_LISTEN (the override the container sets) or the default 127.0.0.1:9471. A wildcard host
// (0.0.0.0, ::, none) is checked on 127.0.0.1.
func healthURL(path string) string {
	listen := os.Getenv("KEEPWARM_DAEMON_LISTEN")
	if listen == "" {
		listen = server.DefaultAddr
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "http://" + listen + path // the request then fails and says why
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + path
}

// cmdHealthcheck is `keepwarm healthcheck`: GET a daemon endpoint (by default /livez) and exit 0 on 200, 1
// otherwise. It exists for container health checks: the distroless image has no curl or wget. A container's
// HEALTHCHECK and a liveness probe check /livez (the process and its scheduler are alive); /readyz (Redis and
// PostgreSQL answer) fails while the fail-safe serves stale values, so it is for readiness only.
func cmdHealthcheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("path", "/livez", "endpoint on the daemon's listen address ($KEEPWARM_DAEMON_LISTEN or "+
		server.DefaultAddr+"): /livez (alive) or /readyz (Redis and PostgreSQL answer)")
	url := fs.String("url", "", "full URL to check instead of --path on the listen address")
	timeout := fs.Duration("timeout", 3*time.Second, "give up after this long")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("healthcheck: unexpected argument %q", fs.Arg(0))
	}
	if *url == "" {
		*url = healthURL(*path)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, *url, nil)
	if err != nil {
		return usagef("healthcheck: --url: %v", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("healthcheck: %s: no answer within %v", *url, *timeout)
		}
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	msg := strings.TrimSpace(string(body))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: %s: %s: %s", *url, resp.Status, msg)
	}
	fmt.Fprintln(stdout, msg)
	return nil
}
