package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// buildDaemon builds keepwarm (without the race detector, whose shadow memory would multiply the figure a memory
// test measures; `go test -race` measured 461 MiB where the plain binary peaked at 96 MiB) into a temporary
// directory and returns its path.
func buildDaemon(t *testing.T) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go is not on PATH: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "keepwarm")
	out, err := exec.Command(gobin, "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build keepwarm: %v\n%s", err, out)
	}
	return bin
}

// startDaemonProcess runs `bin run --config path` as a child process with env added to the test's own; its
// stdout and stderr go to logs. stop sends SIGTERM and returns the exit code.
func startDaemonProcess(t *testing.T, bin, path string, env ...string) (cmd *exec.Cmd, logs *syncBuffer, stop func() int) {
	t.Helper()
	logs = &syncBuffer{}
	cmd = exec.Command(bin, "run", "--config", path)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stopped := false
	stop = func() int {
		if !stopped {
			stopped = true
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
				<-done
				t.Error("keepwarm run did not exit 20 s after SIGTERM")
			}
		}
		return cmd.ProcessState.ExitCode()
	}
	t.Cleanup(func() { stop() })
	return cmd, logs, stop
}

// peakRSS reads a process's peak resident set (VmHWM in /proc/<pid>/status), in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("peak RSS of pid %d: %v", pid, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// One transaction updates 300,000 rows of a fed table (a daemon that held the whole transaction, two column maps
// per row, until its commit reached RSS 374–561 MiB, was OOM-killed under deploy/kubernetes's 256Mi, restarted, and
// given the same transaction again). Under GOMEMLIMIT=200MiB the daemon, in a process of its own, must stay under
// 256 MiB of peak RSS, turn the transaction into a resync (it is above max_transaction_changes) and so bring a
// cached hot key up to its new row.
func TestRunBigTransactionStaysUnderTheMemoryLimit(t *testing.T) {
	t.Parallel()
	const rows, limit = 300_000, 256 << 20
	f := newDaemonFixture(t)
	rdb := testenv.Redis(t)
	pool := testenv.Postgres(t)
	ctx := context.Background()
	name := streamName(t, pool, "kwbig")
	table := strings.ReplaceAll(f.table, `"`, "")
	// The fixture's 20 rows become 300,000, with bodies as wide as the demo's tracks.
	if _, err := pool.Exec(ctx, "insert into "+f.table+" select i::text, jsonb_build_object('id', i, 'name', repeat('n', 120)) from generate_series(21, $1) i", rows); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "alter table "+f.table+" add primary key (id)"); err != nil {
		t.Fatal(err)
	}
	f.write(t, `"1", "2", "3"`, fmt.Sprintf(`fed_by = [{ table = %q, id = "id" }]
[changes]
enabled = true
slot = %q
publication = %q
lease_ttl = "2s"
max_transaction_changes = 100000`, table, name, name))
	cmd, logs, stop := startDaemonProcess(t, buildDaemon(t), f.path, "GOMEMLIMIT=200MiB")
	key := func(id string) string { return f.prefix + "item:" + id }
	testenv.EventuallyDiag(t, 20*time.Second, "pinned ids written and the stream started", withLog(logs, func() bool {
		return rdb.Exists(ctx, key("1"), key("2"), key("3")).Val() == 3 && strings.Contains(logs.String(), "change stream started")
	}))
	before := peakRSS(t, cmd.Process.Pid)
	tag, err := pool.Exec(ctx, "update "+f.table+` set body = body || '{"v": "big"}'`)
	if err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() != rows {
		t.Fatalf("the update changed %d rows, want %d", tag.RowsAffected(), rows)
	}
	// The pinned keys' TTL (2 s) would rewrite them too; the resync's log line says the stream did it.
	testenv.EventuallyDiag(t, 90*time.Second, "the transaction turned into a resync, and the hot key rebuilt from its new row", withLog(logs, func() bool {
		return strings.Contains(logs.String(), "large_transaction") && strings.Contains(rdb.Get(ctx, key("2")).Val(), `"big"`)
	}))
	peak := peakRSS(t, cmd.Process.Pid)
	t.Logf("daemon peak RSS: %.1f MiB before the transaction, %.1f MiB after it (limit %d MiB)", float64(before)/(1<<20), float64(peak)/(1<<20), limit>>20)
	if peak >= limit {
		t.Errorf("daemon peak RSS %.1f MiB, want under %d MiB", float64(peak)/(1<<20), limit>>20)
	}
	if code := stop(); code != 0 {
		t.Errorf("exit code %d, want 0\n%s", code, logs)
	}
}
