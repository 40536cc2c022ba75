package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// TestReadyzNamesReplica runs the daemon with its Redis URL pointing at a replica (a private redis-server made
// REPLICAOF another): Redis answers its PING, but every write is refused with READONLY, so /readyz answers 503
// naming READONLY and the fix. Once the replica is promoted (REPLICAOF NO ONE) /readyz is 200 again.
func TestReadyzNamesReplica(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	ctx := context.Background()
	primary := testenv.PrivateRedis(t)
	replica := testenv.PrivateRedis(t)
	host, port, err := net.SplitHostPort(primary.Options().Addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := replica.Do(ctx, "REPLICAOF", host, port).Err(); err != nil {
		t.Fatalf("REPLICAOF: %v", err)
	}
	if err := replica.Set(ctx, "probe", "x", time.Second).Err(); !redis.HasErrorPrefix(err, "READONLY") {
		t.Fatalf("SET on the replica: %v, want READONLY", err)
	}
	f := newDaemonFixture(t)
	f.write(t, `"1"`, "")
	t.Setenv("KEEPWARM_REDIS_URL", "redis://"+replica.Options().Addr+"/0")
	logs, stop := startRun(t, f.path)
	addr := listenAddr(t, logs)

	var code int
	var body string
	testenv.EventuallyDiag(t, 10*time.Second, "/readyz 503 naming READONLY", withLog(logs, func() bool {
		code, body = readyzBody(t, addr)
		return code == 503 && strings.Contains(body, "READONLY")
	}))
	t.Logf("/readyz: %s", body)
	for _, want := range []string{"redis refuses writes: READONLY", "[redis] url points at a replica; point it at the primary"} {
		if !strings.Contains(body, want) {
			t.Errorf("/readyz = %d %q, want it to contain %q", code, body, want)
		}
	}

	if err := replica.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatalf("REPLICAOF NO ONE: %v", err)
	}
	testenv.EventuallyDiag(t, 20*time.Second, "/readyz 200 after the promotion", withLog(logs, func() bool {
		code, body = readyzBody(t, addr)
		return code == 200
	}))
	testenv.EventuallyDiag(t, 10*time.Second, "the pinned key written on the promoted server", withLog(logs, func() bool {
		return replica.Exists(ctx, f.prefix+"item:1").Val() == 1
	}))
	if code := stop(); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0\n%s", code, logs)
	}
}
