package testenv

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/redisserver"
)

// PrivateRedis starts a private redis-server for this test (see redisserver.Start), stopped on cleanup, and returns a
// client to it. It fails the test, saying what to install, when redis-server cannot start.
func PrivateRedis(tb testing.TB) *redis.Client {
	tb.Helper()
	srv, err := redisserver.Start(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(srv.Stop)
	opt, err := redis.ParseURL(srv.URL)
	if err != nil {
		tb.Fatal(err)
	}
	c := redis.NewClient(opt)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// FreezableRedis is a private redis-server (see redisserver.Start) whose process a test can freeze and thaw, as a stalled
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
	srv, err := redisserver.Start(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	r := &FreezableRedis{URL: srv.URL, proc: srv.Process}
	tb.Cleanup(func() { r.Thaw(tb); srv.Stop() })
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

// RestartableRedis starts a private redis-server for this test (see redisserver.Start), stopped on cleanup, for
// tests that restart it (Server.Restart) as a crash or a deploy would. It fails the test, saying what to install,
// when redis-server cannot start. Clients are the test's to make, from Server.URL.
func RestartableRedis(tb testing.TB) *redisserver.Server {
	tb.Helper()
	srv, err := redisserver.Start(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(srv.Stop)
	return srv
}
