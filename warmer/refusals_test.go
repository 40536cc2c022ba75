package warmer_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/warmer"
)

// refusalSetup returns a keyspace of n pinned ids under "<name>:${id}" with an in-memory source.
func refusalSetup(t *testing.T, name string, n int) warmer.KeyspaceConfig {
	t.Helper()
	keys, err := lockstep.NewKeys(name+":${id}", "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	pinned := make([]string, n)
	for i := range pinned {
		pinned[i] = strconv.Itoa(i)
	}
	return warmer.KeyspaceConfig{Name: name, Keys: keys, Src: &memSource{}, TTL: 2 * time.Second, Jitter: 0.1,
		Pinned: pinned, RefreshAhead: 600 * time.Millisecond, LockTTL: 500 * time.Millisecond,
		StatementTimeout: 200 * time.Millisecond}
}

// refusedWith reports whether err is a *warmer.WriteRefusedError with code and op whose text names the code, and
// says what it is otherwise.
func refusedWith(err error, code, op string) (bool, string) {
	var r *warmer.WriteRefusedError
	if !errors.As(err, &r) || r.Code != code || (op != "" && r.Op != op) || !strings.Contains(err.Error(), code) {
		return false, fmt.Sprintf("WritesRefused = %v (%+v), want a WriteRefusedError with code %s, op %q", err, r, code, op)
	}
	return true, ""
}

// TestWritesRefusedByReplica: a warmer whose Redis is a replica (REPLICAOF another private redis-server) is told
// READONLY by every write; WritesRefused names it. Once the replica is promoted (REPLICAOF NO ONE), writes are taken,
// WritesRefused is nil and the pinned keys are written.
func TestWritesRefusedByReplica(t *testing.T) {
	t.Parallel()
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
	rdb := redis.NewClient(replica.Options())
	t.Cleanup(func() { rdb.Close() })
	cfg := refusalSetup(t, "ro", 5)
	w, reg, _ := start(t, rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
	testenv.EventuallyDiag(t, 10*time.Second, "WritesRefused names READONLY", func() (bool, string) {
		return refusedWith(w.WritesRefused(), warmer.RefusedReadOnly, "")
	})
	for code, want := range map[string]float64{warmer.RefusedReadOnly: 1, warmer.RefusedOOM: 0, warmer.RefusedNoPerm: 0} {
		if got := counter(t, reg, "keepwarm_warmer_redis_writes_refused", map[string]string{"code": code}); got != want {
			t.Errorf("keepwarm_warmer_redis_writes_refused{code=%q} = %v, want %v", code, got, want)
		}
	}

	if err := replica.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatalf("REPLICAOF NO ONE: %v", err)
	}
	testenv.EventuallyDiag(t, 15*time.Second, "writes taken after the promotion, pinned keys written", func() (bool, string) {
		ok := counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"result": warmer.ResultOK})
		return w.WritesRefused() == nil && ok >= 5, fmt.Sprintf("WritesRefused = %v, %v refreshes ok", w.WritesRefused(), ok)
	})
	if got := counter(t, reg, "keepwarm_warmer_redis_writes_refused", nil); got != 0 {
		t.Errorf("keepwarm_warmer_redis_writes_refused after the promotion: %v, want 0", got)
	}
}

// TestWritesRefusedByACL: an ACL user that may read keys but not write them gets NOPERM. With every key read-only
// the flush canary sees it; with only the keyspace's keys read-only (keepwarm:* writable, so the canary passes) the
// lock acquisitions see it, and the canary's success does not hide it. Granting write access ends it.
func TestWritesRefusedByACL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		keys     []string // the user's key permissions
		op       string   // the write WritesRefused names
		readOnly string   // a key the user may not write, to check the setup
	}{
		{"every key read-only", []string{"%R~*"}, "flush canary", "keepwarm:canary:x"},
		{"keyspace keys read-only", []string{"~keepwarm:*", "%R~np:*", "%R~lock:np:*", "%R~meta:np:*"}, "lock", "lock:np:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			admin := testenv.PrivateRedis(t)
			rule := append([]any{"ACL", "SETUSER", "reader", "on", ">pw", "resetkeys", "+@all"}, anySlice(tc.keys)...)
			if err := admin.Do(ctx, rule...).Err(); err != nil {
				t.Fatalf("ACL SETUSER: %v", err)
			}
			rdb := redis.NewClient(&redis.Options{Addr: admin.Options().Addr, Username: "reader", Password: "pw"})
			t.Cleanup(func() { rdb.Close() })
			if err := rdb.Set(ctx, tc.readOnly, "x", time.Second).Err(); !redis.HasErrorPrefix(err, "NOPERM") {
				t.Fatalf("SET %s as the reader: %v, want NOPERM", tc.readOnly, err)
			}
			if err := rdb.Get(ctx, tc.readOnly).Err(); err != nil && !errors.Is(err, redis.Nil) {
				t.Fatalf("GET %s as the reader: %v, want it allowed", tc.readOnly, err)
			}
			cfg := refusalSetup(t, "np", 5)
			w, reg, _ := start(t, rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
			testenv.EventuallyDiag(t, 10*time.Second, "WritesRefused names NOPERM", func() (bool, string) {
				return refusedWith(w.WritesRefused(), warmer.RefusedNoPerm, tc.op)
			})
			// Several canary rounds later (each a SET, run or refused), the refusal is still reported.
			sets := func() int64 {
				stats, _ := admin.Info(ctx, "commandstats").Result()
				var n int64
				for _, line := range strings.Split(stats, "\n") {
					if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_set:"); ok {
						for _, f := range strings.Split(rest, ",") {
							if k, v, _ := strings.Cut(f, "="); k == "calls" || k == "rejected_calls" {
								c, _ := strconv.ParseInt(v, 10, 64)
								n += c
							}
						}
					}
				}
				return n
			}
			// Checked every few ms while Redis sees 20 more SETs (the canary's, every 250 ms, and the locks'): a
			// canary that passes must not clear a refusal of the keyspace's keys, not even for a moment.
			c0 := sets()
			var cleared []string
			testenv.Eventually(t, 20*time.Second, "20 more SETs (canary rounds and locks)", func() bool {
				if ok, why := refusedWith(w.WritesRefused(), warmer.RefusedNoPerm, tc.op); !ok {
					cleared = append(cleared, why)
				}
				return sets() >= c0+20
			})
			if len(cleared) > 0 {
				t.Errorf("the refusal was not reported %d times meanwhile, e.g.: %s", len(cleared), cleared[0])
			}

			if err := admin.Do(ctx, "ACL", "SETUSER", "reader", "~*").Err(); err != nil {
				t.Fatalf("ACL SETUSER: %v", err)
			}
			testenv.EventuallyDiag(t, 15*time.Second, "writes taken once granted, pinned keys written", func() (bool, string) {
				ok := counter(t, reg, "keepwarm_warmer_refreshes_total", map[string]string{"result": warmer.ResultOK})
				return w.WritesRefused() == nil && ok >= 5, fmt.Sprintf("WritesRefused = %v, %v refreshes ok", w.WritesRefused(), ok)
			})
		})
	}
}

func anySlice(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
