package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartRedis starts a private redis-server (no persistence) on a free loopback port and returns its URL and a
// function that stops it and removes its directory. Tests and benchmarks use it when they change server-wide
// state (SCRIPT FLUSH, CONFIG SET) or read server-wide counters (INFO commandstats) that the shared server of
// scripts/services would mix with other packages' tests. It needs the redis-server binary (scripts/services up
// installs it; otherwise apt-get install redis-server).
func StartRedis(ctx context.Context) (url string, stop func(), err error) {
	url, _, stop, err = startRedis(ctx)
	return url, stop, err
}

// startRedis is StartRedis that also returns the server's process.
func startRedis(ctx context.Context) (url string, proc *os.Process, stop func(), err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "keepwarm-redis-")
	if err != nil {
		return "", nil, nil, err
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", dir, "--logfile", "")
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return "", nil, nil, fmt.Errorf("start redis-server (run `scripts/services up`, which installs it, or apt-get install redis-server): %w", err)
	}
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		os.RemoveAll(dir)
	}
	url = fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1})
	defer c.Close()
	for i := 0; ; i++ {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return url, cmd.Process, stop, nil
		}
		if i > 50 {
			stop()
			return "", nil, nil, fmt.Errorf("private redis-server on port %d did not answer: %w", port, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// PrivateRedis starts a private redis-server for this test (see StartRedis), stopped on cleanup, and returns a
// client to it. It fails the test, saying what to install, when redis-server cannot start.
func PrivateRedis(tb testing.TB) *redis.Client {
	tb.Helper()
	url, stop, err := StartRedis(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(stop)
	opt, err := redis.ParseURL(url)
	if err != nil {
		tb.Fatal(err)
	}
	c := redis.NewClient(opt)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// FreezableRedis is a private redis-server (see StartRedis) whose process a test can freeze and thaw, as a stalled
// VM, a long fork or a GC pause of the host would: while frozen, commands sent to it are buffered by the kernel
// and run when it thaws, even those whose client gave up and closed the connection.
type FreezableRedis struct {
	URL  string
	proc *os.Process
}

// PrivateFreezableRedis starts a FreezableRedis for this test, stopped (and thawed first) on cleanup. It fails the
// test, saying what to install, when redis-server cannot start.
func PrivateFreezableRedis(tb testing.TB) *FreezableRedis {
	tb.Helper()
	url, proc, stop, err := startRedis(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	r := &FreezableRedis{URL: url, proc: proc}
	tb.Cleanup(func() { r.Thaw(tb); stop() })
	return r
}

// Freeze stops the server process (SIGSTOP); it has stopped when Freeze returns.
func (r *FreezableRedis) Freeze(tb testing.TB) {
	if err := r.proc.Signal(syscall.SIGSTOP); err != nil {
		tb.Errorf("freeze redis-server: %v", err)
	}
}

// Thaw resumes the server process (SIGCONT).
func (r *FreezableRedis) Thaw(tb testing.TB) {
	if err := r.proc.Signal(syscall.SIGCONT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		tb.Errorf("thaw redis-server: %v", err)
	}
}
