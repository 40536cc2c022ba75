package reload_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/reload"
	"github.com/keepwarm/keepwarm/internal/testenv"
)

// TestSiblingWritesDoNotDelayReload: a file written every 200 ms beside the config (in the watched directory)
// does not delay a reload: the change is applied within 2 s of the write. A watcher that restarted its quiet
// period on every event in the directory would never reload.
func TestSiblingWritesDoNotDelayReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	write(t, path, "version = 1\n")
	h := start(t, path, always)
	testenv.WriteEvery(t, filepath.Join(dir, "sibling.txt"), 200*time.Millisecond, time.Hour, false)

	for v := 2; v <= 3; v++ {
		wrote := time.Now()
		want := fmt.Sprintf("version = %d\n", v)
		write(t, path, want)
		c := h.nextBy(wrote.Add(2*time.Second), "config change beside a busy sibling")
		if c.content != want {
			t.Fatalf("reload %d: got %+v, want content %q", v, c, want)
		}
		t.Logf("reload %d applied %v after the write", v, c.at.Sub(wrote).Round(time.Millisecond))
	}
}

// TestOwnDebugLogInWatchedDirDoesNotFeedItself: the watcher logs at debug level into a file in the watched
// directory (a daemon whose log file sits beside its config). A change is still applied within 2 s, and the log
// grows by a few lines per decision, not per event: it used to log each event, which wrote the log file, which
// was an event, and so on (66 MB in 5 s) while the quiet period never ended.
func TestOwnDebugLogInWatchedDirDoesNotFeedItself(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	write(t, path, "version = 1\n")
	logFile, err := os.Create(filepath.Join(dir, "keepwarm.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logFile.Close() })
	h := startWith(t, path, setup{apply: func(string, bool) error { return nil }, logTo: logFile})

	wrote := time.Now()
	write(t, path, "version = 2\n")
	if c := h.nextBy(wrote.Add(2*time.Second), "config change with the log in the directory"); c.content != "version = 2\n" {
		t.Fatalf("got %+v, want the new content", c)
	}
	// Touch the file without changing it: the watcher checks, logs that one decision, and must then be idle.
	now := time.Now()
	if err := os.Chtimes(path, now, now); err != nil {
		t.Fatal(err)
	}
	h.waitLog("content is unchanged", 1)
	write(t, path, "version = 3\n")
	if c := h.next("second change"); c.content != "version = 3\n" {
		t.Fatalf("got %+v, want the second change", c)
	}
	b, err := os.ReadFile(logFile.Name())
	if err != nil {
		t.Fatal(err)
	}
	// Three decisions (two reloads, one unchanged check): a handful of lines. Per-event logging feeds itself
	// and writes thousands in this time.
	if lines := strings.Count(string(b), "\n"); lines > 10 {
		t.Fatalf("the watcher wrote %d log lines for 3 decisions, want at most 10; first lines:\n%.2000s", lines, b)
	}
}

// TestMaxDelayUnderConstantWrites: a writer that keeps appending to the config file every 300 ms for 10 s never
// leaves a quiet second, yet the content is checked, and reloaded, within the ceiling (DefaultMaxDelay after the
// first change), and the final content once the writer stops. It used to wait for the writer to stop.
func TestMaxDelayUnderConstantWrites(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	write(t, path, "version = 1\n")
	h := start(t, path, always)

	first := time.Now()
	stopped := testenv.WriteEvery(t, path, 300*time.Millisecond, 10*time.Second, true)
	// 2 s of slack for a busy machine; the writer still has 3 s to go then, so this is the ceiling at work.
	c := h.nextBy(first.Add(reload.DefaultMaxDelay+2*time.Second), "reload while the writer keeps writing")
	if c.reason != "file" || !strings.HasPrefix(c.content, "version = 1\n# touch 0\n") {
		t.Fatalf("got %+v, want a file reload of the content written so far", c)
	}
	select {
	case <-stopped:
		t.Fatalf("the writer stopped (at 10 s) before the first reload, %v after the first change: no ceiling seen",
			c.at.Sub(first))
	default:
	}
	t.Logf("first reload %v after the first change", c.at.Sub(first).Round(time.Millisecond))

	<-stopped
	final, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for c.content != string(final) {
		c = h.next("reload of the writer's final content")
	}
}
