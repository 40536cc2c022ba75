package reload_test

import (
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/reload"
)

// removalGuard is a reload function like the daemon's: the content is a list of "keyspace <name>" lines, and a
// change that removes a name is answered with reload.ErrSettle unless final. It records what it applied.
type removalGuard struct {
	mu      sync.Mutex
	applied []string // contents applied, in order; [0] is the initial one
}

func (g *removalGuard) apply(content string, final bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	old := g.applied[len(g.applied)-1]
	for _, line := range strings.Split(strings.TrimSpace(old), "\n") {
		if !strings.Contains(content, line+"\n") && !final {
			return reload.ErrSettle
		}
	}
	g.applied = append(g.applied, content)
	return nil
}

func (g *removalGuard) history() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.applied...)
}

// TestCutConfigNotApplied writes a cut config: the writer stops after the first keyspace (the rest of the
// file is still to come), pauses until the cut has been tried, and completes it. The cut file is valid but
// removes a keyspace, so it waits for the settle period; the completed file arrives within it and is applied;
// the cut one never is. It used to be applied after the quiet period, a keyspace vanishing until the writer was
// done.
func TestCutConfigNotApplied(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	const full0, cut, full1 = "keyspace a\nkeyspace b\n", "keyspace a\n", "keyspace a\nkeyspace b\nkeyspace c\n"
	write(t, path, full0)
	g := &removalGuard{applied: []string{full0}}
	// A settle period far longer than the test: the writer completes the file within it however slow the machine.
	h := startWith(t, path, setup{apply: g.apply, opts: []reload.Option{reload.WithSettle(time.Minute)}})

	write(t, path, cut)
	c := h.next("cut file")
	if c.content != cut || c.final || !errors.Is(c.err, reload.ErrSettle) {
		t.Fatalf("first call: got %+v, want the cut content, not final, answered ErrSettle", c)
	}
	// The writer, paused until now (the cut was tried and held back), completes the file.
	write(t, path, full1)
	for c.content != full1 {
		c = h.next("completed file")
	}
	if c.err != nil {
		t.Fatalf("completed file: got %+v, want it applied", c)
	}
	if got := g.history(); len(got) != 2 || got[1] != full1 {
		t.Fatalf("applied %q, want only the completed file after the initial one (never the cut one)", got)
	}
}

// TestRemovalAppliedAfterSettle: a real removal, not followed by any write, is applied by the final call no
// sooner than DefaultSettle after the write (it used to be applied after the 1 s quiet period), and applied then.
func TestRemovalAppliedAfterSettle(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	const full, removed = "keyspace a\nkeyspace b\n", "keyspace a\n"
	write(t, path, full)
	g := &removalGuard{applied: []string{full}}
	h := startWith(t, path, setup{apply: g.apply})

	wrote := time.Now()
	write(t, path, removed)
	if c := h.next("removal"); c.final || !errors.Is(c.err, reload.ErrSettle) {
		t.Fatalf("first call: got %+v, want not final, answered ErrSettle", c)
	}
	c := h.next("removal settled")
	if !c.final || c.err != nil || c.content != removed {
		t.Fatalf("second call: got %+v, want final and applied", c)
	}
	if d := c.at.Sub(wrote); d < reload.DefaultSettle {
		t.Fatalf("removal applied %v after the write, want at least DefaultSettle (%v)", d, reload.DefaultSettle)
	}
	if got := g.history(); len(got) != 2 || got[1] != removed {
		t.Fatalf("applied %q, want the removal once", got)
	}
	h.noCall()
}
