package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// defaultHealthURL is the readiness endpoint of a daemon on its default listen address.
const defaultHealthURL = "http://127.0.0.1:9471/readyz"

// cmdHealthcheck is `keepwarm healthcheck`: GET a daemon endpoint (by default /readyz) and exit 0 on 200, 1
// otherwise. It exists for container health checks: the distroless image has no curl or wget.
func cmdHealthcheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", defaultHealthURL, "endpoint to check: /readyz (Redis and PostgreSQL answer) or /healthz (alive)")
	timeout := fs.Duration("timeout", 3*time.Second, "give up after this long")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("healthcheck: unexpected argument %q", fs.Arg(0))
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
