package testenv

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// FillToOOM brings a private Redis to the state of a full cache that may not evict: maxmemory-policy noeviction,
// maxmemory just above the memory used, junk keys without TTL ("junk:<n>", 1 KiB each) written until Redis refuses
// one with OOM. Then it sets maxmemory 64 KiB below the memory used, so that the few KiB by which client buffers
// come and go cannot let a write through now and then. It fails the test unless a SET NX of a new key (as a lock
// acquisition sends) is then refused with OOM, so that a test under it cannot pass on a Redis that still takes new
// keys. It returns the junk keys; FreeOOM undoes it. Never call it on the shared Redis.
func FillToOOM(tb testing.TB, rdb *redis.Client) (junk []string) {
	tb.Helper()
	ctx := context.Background()
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		tb.Fatal(err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", strconv.FormatInt(UsedMemory(tb, rdb)+64<<10, 10)).Err(); err != nil {
		tb.Fatal(err)
	}
	v := strings.Repeat("j", 1024)
	for i := 0; ; i++ {
		k := "junk:" + strconv.Itoa(i)
		err := rdb.Set(ctx, k, v, 0).Err()
		if redis.HasErrorPrefix(err, "OOM") {
			break
		}
		if err != nil {
			tb.Fatalf("fill Redis: %v", err)
		}
		junk = append(junk, k)
		if i > 10000 {
			tb.Fatalf("10 MiB written over a 64 KiB headroom and no OOM: maxmemory not in force")
		}
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", strconv.FormatInt(UsedMemory(tb, rdb)-64<<10, 10)).Err(); err != nil {
		tb.Fatal(err)
	}
	if err := rdb.SetArgs(ctx, "lock:oom-probe", "token", redis.SetArgs{Mode: "NX", TTL: time.Second}).Err(); !redis.HasErrorPrefix(err, "OOM") {
		tb.Fatalf("SET NX of a new key after filling Redis: %v, want the OOM refusal", err)
	}
	return junk
}

// FreeOOM undoes FillToOOM: it deletes the junk keys and lifts maxmemory (0: no limit).
func FreeOOM(tb testing.TB, rdb *redis.Client, junk []string) {
	tb.Helper()
	ctx := context.Background()
	if len(junk) > 0 {
		if err := rdb.Del(ctx, junk...).Err(); err != nil {
			tb.Fatalf("delete the junk: %v", err)
		}
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		tb.Fatal(err)
	}
}

// UsedMemory is INFO memory's used_memory, in bytes.
func UsedMemory(tb testing.TB, rdb *redis.Client) int64 {
	tb.Helper()
	info, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				return n
			}
		}
	}
	tb.Fatalf("no used_memory in INFO memory:\n%s", info)
	return 0
}
