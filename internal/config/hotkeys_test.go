package config_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/keepwarm/keepwarm/internal/config"
)

// TestHotkeysFileSkipsBadLines: a 10,000-id list file with bad lines (invalid UTF-8, an id longer than
// MaxIDBytes, a line longer than the reader's buffer) loads: the bad lines are reported with their line numbers in
// Skipped, and every other id is pinned. Before, one bad line made the whole config invalid.
func TestHotkeysFileSkipsBadLines(t *testing.T) {
	var b strings.Builder
	bad := map[int]string{
		17:   "\xff\xfe1",                  // invalid UTF-8
		4000: strings.Repeat("x", 5000),    // longer than an id may be
		9000: strings.Repeat("y", 100_000), // longer than any buffer the reader keeps
	}
	want := 0
	for line := 1; line <= 10_000; line++ {
		if s, ok := bad[line]; ok {
			b.WriteString(s + "\n")
			continue
		}
		fmt.Fprintf(&b, "%d\n", line)
		want++
	}
	text := cfg(map[string]string{"REST": "[[hotkeys]]\nname = \"big\"\nkeyspace = \"track\"\nfile = \"lists/ids.txt\""})
	c, err := load(t, text, map[string]string{"lists/ids.txt": b.String()})
	if err != nil {
		var ve *config.ValidationError
		if errors.As(err, &ve) {
			t.Fatalf("LoadEnv: %d problems, want none (bad lines are skipped):\n%s", len(ve.Problems), strings.Join(ve.Problems[:min(3, len(ve.Problems))], "\n"))
		}
		t.Fatalf("LoadEnv: %v", err)
	}
	h := c.HotkeysList("big")
	if got := len(h.IDs); got != want {
		t.Errorf("IDs: %d ids, want %d", got, want)
	}
	if got := len(c.Pinned("track")); got != want {
		t.Errorf("Pinned: %d ids, want %d", got, want)
	}
	wantSkipped := []string{
		`lists/ids.txt:17: lockstep: invalid id: "\xff\xfe1" is not valid UTF-8`,
		`lists/ids.txt:4000: lockstep: invalid id: 5000 bytes, more than 4096`,
		`lists/ids.txt:9000: lockstep: invalid id: line longer than`,
	}
	if len(h.Skipped) != len(wantSkipped) {
		t.Fatalf("Skipped: got %q, want %d lines", h.Skipped, len(wantSkipped))
	}
	for i, w := range wantSkipped {
		if !strings.HasPrefix(h.Skipped[i], w) {
			t.Errorf("Skipped[%d] = %q, want it to start with %q", i, h.Skipped[i], w)
		}
	}
	for _, id := range h.IDs {
		if id == "9001" {
			return
		}
	}
	t.Error("id 9001, the line after the overlong one, is missing: the reader lost its place")
}

// TestHotkeysInlineBadIDStaysAnError: ids written in the config itself are the config author's: a bad one is
// still a problem, reported with its index.
func TestHotkeysInlineBadIDStaysAnError(t *testing.T) {
	text := cfg(map[string]string{"REST": "[[hotkeys]]\nname = \"hk\"\nkeyspace = \"track\"\nids = [\"1\", \"\"]"})
	_, err := load(t, text, nil)
	var ve *config.ValidationError
	if !errors.As(err, &ve) || !strings.Contains(ve.Error(), `hotkeys "hk": ids[1]: lockstep: invalid id: empty`) {
		t.Errorf("LoadEnv: got %v, want the inline empty id reported", err)
	}
}
