package reload_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/reload"
	"github.com/keepwarm/keepwarm/internal/testenv"
)

// call is one reload call, with the config content on disk when it was made, when it was made and what the
// reload function returned.
type call struct {
	reason  string
	final   bool
	content string
	at      time.Time
	err     error
}

// harness runs a Watcher over path.
type harness struct {
	t     *testing.T
	path  string
	logs  *syncBuffer
	calls chan call
}

// syncBuffer collects a daemon's log output.
type syncBuffer = testenv.LogBuffer

// setup is what a harness runs: apply is the reload function (it gets the content on disk and final), logTo
// also receives the watcher's debug log when set, and opts go to reload.New.
type setup struct {
	apply func(content string, final bool) error
	logTo io.Writer
	opts  []reload.Option
}

// start runs a Watcher over path with default settings; valid decides whether a content is a valid config.
func start(t *testing.T, path string, valid func(string) bool) *harness {
	t.Helper()
	return startWith(t, path, setup{apply: func(content string, _ bool) error {
		if !valid(content) {
			return errors.New("invalid")
		}
		return nil
	}})
}

func startWith(t *testing.T, path string, s setup) *harness {
	t.Helper()
	h := &harness{t: t, path: path, logs: &syncBuffer{}, calls: make(chan call, 100)}
	var out io.Writer = h.logs
	if s.logTo != nil {
		out = io.MultiWriter(h.logs, s.logTo)
	}
	log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	w, err := reload.New(log, []string{path}, s.opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(ctx, func(reason string, final bool) error {
			b, _ := os.ReadFile(path)
			err := s.apply(string(b), final)
			h.calls <- call{reason, final, string(b), time.Now(), err}
			return err
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return h
}

// next waits for the next reload call.
func (h *harness) next(what string) call {
	h.t.Helper()
	return h.nextBy(time.Now().Add(20*time.Second), what)
}

// nextBy waits for the next reload call until deadline, and fails the test if none came by then.
func (h *harness) nextBy(deadline time.Time, what string) call {
	h.t.Helper()
	select {
	case c := <-h.calls:
		return c
	case <-time.After(time.Until(deadline)):
		log := h.logs.String()
		if len(log) > 4000 {
			log = fmt.Sprintf("(%d bytes before)\n…%s", len(log)-4000, log[len(log)-4000:])
		}
		h.t.Fatalf("%s: no reload by %s; watcher log:\n%s", what, deadline.Format("15:04:05.000"), log)
		return call{}
	}
}

// waitLog waits until the watcher has logged sub n times (it logs each decision, e.g. an unchanged-content
// check).
func (h *harness) waitLog(sub string, n int) {
	h.t.Helper()
	testenv.Eventually(h.t, 20*time.Second, fmt.Sprintf("watcher logged %q %d times", sub, n), func() bool {
		return h.logs.Count(sub) >= n
	})
}

func (h *harness) noCall() {
	h.t.Helper()
	select {
	case c := <-h.calls:
		h.t.Fatalf("unexpected reload %+v", c)
	default:
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func always(string) bool { return true }

// configMap builds a Kubernetes ConfigMap volume in dir: config.toml -> ..data/config.toml,
// ..data -> ..<version>, and returns a function that publishes a new version the way the kubelet does (new
// version directory, ..data_tmp symlink renamed over ..data, old directory removed).
func configMap(t *testing.T, dir, content string) (publish func(version, content string)) {
	t.Helper()
	current := ""
	publish = func(version, content string) {
		t.Helper()
		vdir := filepath.Join(dir, ".."+version)
		if err := os.Mkdir(vdir, 0o755); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(vdir, "config.toml"), content)
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(".."+version, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		if current != "" {
			if err := os.RemoveAll(filepath.Join(dir, ".."+current)); err != nil {
				t.Fatal(err)
			}
		}
		current = version
	}
	publish("2026_11_30_v1", content)
	if err := os.Symlink("..data/config.toml", filepath.Join(dir, "config.toml")); err != nil {
		t.Fatal(err)
	}
	return publish
}

// TestConfigMapSwap: an atomic swap of ..data reloads; a swap to the same content does not; an edit through
// the symlink reloads too, also after the swap moved the link to a new directory.
func TestConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	publish := configMap(t, dir, "version = 1\n")
	h := start(t, filepath.Join(dir, "config.toml"), always)

	publish("2026_11_30_v2", "version = 2\n")
	if c := h.next("..data swapped to v2"); c.reason != "file" || c.content != "version = 2\n" {
		t.Fatalf("reload after the swap: got %+v, want reason file and the v2 content", c)
	}

	publish("2026_11_30_v3", "version = 2\n") // same content, new version directory
	h.waitLog("content is unchanged", 1)
	h.noCall()

	write(t, filepath.Join(dir, "config.toml"), "version = 3\n") // through both symlinks, into ..2026_11_30_v3
	if c := h.next("edit through the symlink"); c.content != "version = 3\n" {
		t.Fatalf("reload after the edit: got %+v, want the edited content", c)
	}
}

// TestPartialWriteNotApplied: a writer that pauses 350 ms mid-file (its partial file is valid) must get only
// its full file applied, once.
func TestPartialWriteNotApplied(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	write(t, path, "a = 1\n")
	h := start(t, path, always)

	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("a = 2\n"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(350 * time.Millisecond) // the writer's own pause, part of the repro; nothing is asserted on time
	if _, err := f.WriteString("[[hotkeys]]\nname = \"x\"\n"); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	c := h.next("full write")
	if want := "a = 2\n[[hotkeys]]\nname = \"x\"\n"; c.content != want {
		t.Fatalf("applied %q, want only the full file %q", c.content, want)
	}
}

// TestInvalidReportedOnlyIfItStays: an invalid file is tried without reporting (final false); only if it is
// still the same after another quiet period is the call final. A file that becomes valid meanwhile never gets a
// final failing call.
func TestInvalidReportedOnlyIfItStays(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	write(t, path, "ok\n")
	h := start(t, path, func(s string) bool { return !strings.Contains(s, "broken") })

	write(t, path, "broken\n")
	if c := h.next("invalid write"); c.final {
		t.Fatalf("first try of an invalid file: got %+v, want final false", c)
	}
	if c := h.next("invalid file stays"); !c.final || c.content != "broken\n" {
		t.Fatalf("second try: got %+v, want final true for the same content", c)
	}

	write(t, path, "broken again\n")
	if c := h.next("invalid write 2"); c.final {
		t.Fatalf("first try: got %+v, want final false", c)
	}
	write(t, path, "fixed\n")
	c := h.next("fixed")
	if c.content != "fixed\n" {
		// The retry timer may have fired before the fix was seen; it must not be final for a changed file.
		if c.final && c.content != "broken again\n" {
			t.Fatalf("got %+v", c)
		}
		c = h.next("fixed")
	}
	if c.content != "fixed\n" || c.final {
		t.Fatalf("after the fix: got %+v, want the fixed content on a first (non-final) try", c)
	}
}
