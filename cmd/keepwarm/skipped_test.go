package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// listWithBadLines writes a hot-key list file of ids 1..20 where lines 2 (invalid UTF-8) and 5 (5,000 bytes)
// are not valid ids, and returns a [[hotkeys]] entry naming it.
func listWithBadLines(t *testing.T, f *daemonFixture) string {
	t.Helper()
	var b strings.Builder
	for i := 1; i <= 20; i++ {
		switch i {
		case 2:
			b.WriteString("\xff\xfe2\n")
		case 5:
			b.WriteString(strings.Repeat("5", 5000) + "\n")
		default:
			b.WriteString(strings.Repeat(" ", i%2) + strconv.Itoa(i) + "\n")
		}
	}
	if err := os.WriteFile(filepath.Join(f.dir, "hot.txt"), []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return "\n[[hotkeys]]\nname = \"file\"\nkeyspace = \"items\"\nfile = \"hot.txt\"\n"
}

// TestValidateListsSkippedLines: validate accepts a config whose list file has bad lines (run would start) and
// lists each bad line with its file:line.
func TestValidateListsSkippedLines(t *testing.T) {
	t.Parallel()
	f := newDaemonFixture(t)
	f.write(t, `"1"`, listWithBadLines(t, f))
	stdout, stderr, code := keepwarm(t, "validate", "--config", f.path)
	if code != 0 {
		t.Fatalf("validate: exit %d, want 0 (run skips bad list lines); stderr:\n%s", code, stderr)
	}
	for _, want := range []string{
		`warning: hotkeys "file": 2 lines are not valid ids; run skips them and warms the other 18:`,
		`  hot.txt:2: lockstep: invalid id: "\xff\xfe2" is not valid UTF-8`,
		`  hot.txt:5: lockstep: invalid id: 5000 bytes, more than 4096`,
	} {
		if !strings.Contains(stdout, want+"\n") {
			t.Errorf("validate: got\n%s\nwant a line\n%s", stdout, want)
		}
	}
}

// TestRunSkipsBadListLines: run starts on a list file with bad lines, warms the valid ids, logs one summary
// warning and counts the skipped lines.
func TestRunSkipsBadListLines(t *testing.T) {
	// Serial: `keepwarm run` sets go-redis's process-wide logger (routeRedisLogs).
	f := newDaemonFixture(t)
	rdb := testenv.Redis(t)
	ctx := context.Background()
	f.write(t, `"1"`, listWithBadLines(t, f))
	logs, stop := startRun(t, f.path)
	addr := listenAddr(t, logs)
	testenv.EventuallyDiag(t, 5*time.Second, "the list's valid ids written", withLog(logs, func() bool {
		return rdb.Exists(ctx, f.prefix+"item:3", f.prefix+"item:20").Val() == 2
	}))
	var metrics string
	testenv.EventuallyDiag(t, 5*time.Second, "skipped lines counted", withLog(logs, func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		metrics = string(b)
		return strings.Contains(metrics, `keepwarm_config_skipped_ids_total{keyspace="items"} 2`)
	}))
	if code := stop(); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
	if n := strings.Count(logs.String(), "hot-key lists: skipped lines"); n != 1 {
		t.Errorf("%d summary warnings, want 1:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), "hot.txt:2: lockstep: invalid id") {
		t.Errorf("the warning does not name the first bad line:\n%s", logs)
	}
}

// TestWarmupListSkipsBadLines: `warmup --list` warms the valid ids of a list file with bad lines and says how
// many lines it skipped.
func TestWarmupListSkipsBadLines(t *testing.T) {
	t.Parallel()
	f := newDaemonFixture(t)
	rdb := testenv.Redis(t)
	f.write(t, `"1"`, listWithBadLines(t, f))
	_, stderr, code := keepwarm(t, "warmup", "--config", f.path, "--keyspace", "items", "--list", "file")
	if code != 0 {
		t.Fatalf("warmup: exit %d, stderr:\n%s", code, stderr)
	}
	if n := strings.Count(stderr, "skipping lines of the list that are not valid ids"); n != 1 {
		t.Errorf("warmup: %d warnings about skipped lines, want 1; stderr:\n%s", n, stderr)
	}
	var keys []string
	for i := 1; i <= 20; i++ {
		keys = append(keys, f.prefix+"item:"+strconv.Itoa(i))
	}
	if n := rdb.Exists(context.Background(), keys...).Val(); n != 18 {
		t.Errorf("%d of ids 1..20 written, want the 18 valid ones", n)
	}
}
