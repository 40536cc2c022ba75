package main

import (
	"context"
	"maps"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// TestCeilingScripts runs the meta benchmark's redis-benchmark scripts once each on a private redis-server: each
// takes the lock, publishes through lockstep's publish.lua, and makes exactly the Redis calls of the hand-written
// copies it replaced (INFO commandstats), so the ceiling measures the same work.
func TestCeilingScripts(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.PrivateRedis(t)
	for _, tt := range []struct {
		name  string
		meta  bool
		calls map[string]int64
	}{
		{"meta off", false, map[string]int64{"eval": 1, "set": 2, "get": 1, "pttl": 1, "del": 2}},
		{"meta on", true, map[string]int64{"eval": 1, "set": 2, "get": 1, "pttl": 1, "type": 1, "time": 1, "hset": 1,
			"hdel": 1, "pexpire": 1, "del": 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			key := "mb:" + strings.ReplaceAll(tt.name, " ", "-")
			if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatalf("CONFIG RESETSTAT: %v", err)
			}
			got, err := rdb.Eval(ctx, ceilingScripts[tt.name], []string{key}, "token", "value", 60000).Int64Slice()
			if err != nil {
				t.Fatalf("EVAL: %v", err)
			}
			if want := []int64{1, -2}; !slices.Equal(got, want) {
				t.Errorf("reply: got %v, want %v (written; the key did not exist)", got, want)
			}
			calls, err := commandstats(ctx, rdb)
			if err != nil {
				t.Fatal(err)
			}
			delete(calls, "config|resetstat")
			delete(calls, "config")
			if !maps.Equal(calls, tt.calls) {
				t.Errorf("Redis calls: got %v, want %v", calls, tt.calls)
			}
			if v := rdb.Get(ctx, key).Val(); v != "value" {
				t.Errorf("value: got %q, want %q", v, "value")
			}
			if n := rdb.Exists(ctx, "lock:"+key).Val(); n != 0 {
				t.Errorf("the lock is still there")
			}
			hasMeta := rdb.Exists(ctx, "meta:"+key).Val() == 1
			if hasMeta != tt.meta {
				t.Errorf("meta hash written: got %v, want %v", hasMeta, tt.meta)
			}
			if tt.meta {
				if d := rdb.HGet(ctx, "meta:"+key, "delta_ms").Val(); d != strconv.Itoa(3) {
					t.Errorf("meta delta_ms: got %q, want 3", d)
				}
			}
		})
	}
}

// TestPinPID: pinPID sets every thread of a process to the given CPUs, as /proc reports them afterwards. CPU 0
// exists on every machine; --pin itself needs two.
func TestPinPID(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sleep: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if err := pinPID(context.Background(), cmd.Process.Pid, "0"); err != nil {
		t.Fatalf("pinPID: %v", err)
	}
	got, err := allowedCPUs(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if got != "0" {
		t.Errorf("Cpus_allowed_list after pinning to CPU 0: got %q, want %q", got, "0")
	}
	if err := pinPID(context.Background(), 1<<30, "0"); err == nil {
		t.Error("pinPID of a process that does not exist: got no error")
	}
}
