// Package redisserver runs private redis-server processes and tidies a shared server's keys, for tests and for
// keepwarm-bench. It does not import package testing, so the benchmark binary does not link it; the test-facing
// wrappers (testenv.PrivateRedis, testenv.PrivateFreezableRedis, testenv.Prefix) live in internal/testenv.
package redisserver

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a private redis-server (no persistence) listening on a loopback port.
type Server struct {
	// URL is the server's address as a redis:// URL, database 0.
	URL string
	// Process is the redis-server process, for tests that freeze (SIGSTOP) and thaw (SIGCONT) it.
	Process *os.Process

	port int
	dir  string
	stop func() // stops the current process
}

// Start starts a private redis-server on a free loopback port and waits until it answers PING (up to about 5 s).
// Tests and benchmarks use it when they change server-wide state (SCRIPT FLUSH, CONFIG SET) or read server-wide
// counters (INFO commandstats) that the shared server of scripts/services would mix with other packages' tests.
// It needs the redis-server binary (scripts/services up installs it; otherwise apt-get install redis-server) and
// returns an error saying so when it cannot run it. The caller stops the server with Stop.
func Start(ctx context.Context) (*Server, error) { return StartPort(ctx, 0) }

// StartPort is Start on a given loopback port (0: a free one), for benchmarks that must stay within a port range
// agreed with others sharing the machine. It fails when the port is taken.
func StartPort(ctx context.Context, port int) (*Server, error) {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return nil, fmt.Errorf("find a free port: %w", err)
	}
	port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "keepwarm-redis-")
	if err != nil {
		return nil, fmt.Errorf("make redis-server directory: %w", err)
	}
	s := &Server{URL: fmt.Sprintf("redis://127.0.0.1:%d/0", port), port: port, dir: dir}
	if err := s.start(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// start runs redis-server on s.port and waits until it answers PING.
func (s *Server) start(ctx context.Context) error {
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", s.dir, "--logfile", "")
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server (run `scripts/services up`, which installs it, or apt-get install redis-server): %w", err)
	}
	s.Process = cmd.Process
	s.stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}
	if err := WaitPing(ctx, fmt.Sprintf("127.0.0.1:%d", s.port)); err != nil {
		s.stop()
		return fmt.Errorf("private redis-server on port %d: %w", s.port, err)
	}
	return nil
}

// WaitPing waits until the Redis server at addr ("host:port") answers PING: up to 51 tries, each bounded by 1 s,
// 100 ms apart. It returns the last error when the server never answered, or ctx's.
func WaitPing(ctx context.Context, addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	for i := 0; ; i++ {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if i > 50 || ctx.Err() != nil {
			return fmt.Errorf("did not answer PING: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Restart stops the server and starts a new one on the same port, as a crash or a deploy would: every setting
// changed with CONFIG SET is back at its default, every key is gone (no persistence) and every client connection
// is closed. It returns once the new server answers PING.
func (s *Server) Restart(ctx context.Context) error {
	s.stop()
	return s.start(ctx)
}

// Stop stops the server (SIGTERM, then waits for it to exit) and removes its directory.
func (s *Server) Stop() {
	s.stop()
	os.RemoveAll(s.dir)
}

// globEscaper escapes the characters that SCAN MATCH's glob-style patterns treat specially.
var globEscaper = strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`)

// DeleteContaining deletes every key whose name contains s, by scanning for the pattern *s* (1000 keys per SCAN
// and per UNLINK). A test's or a benchmark's key prefix is usually spliced into templates after other text
// ("lock:" + prefix + id), so matching the prefix alone would miss those keys. It returns the first error from
// Redis; keys deleted before it stay deleted.
func DeleteContaining(ctx context.Context, c redis.UniversalClient, s string) error {
	iter := c.Scan(ctx, 0, "*"+globEscaper.Replace(s)+"*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 1000 {
			if err := c.Unlink(ctx, batch...).Err(); err != nil {
				return fmt.Errorf("unlink keys containing %q: %w", s, err)
			}
			batch = batch[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("scan keys containing %q: %w", s, err)
	}
	if len(batch) > 0 {
		if err := c.Unlink(ctx, batch...).Err(); err != nil {
			return fmt.Errorf("unlink keys containing %q: %w", s, err)
		}
	}
	return nil
}
