package config_test

import (
	"errors"
	"fmt"
	"slices"
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

// TestNULIDsRejectedAtLoad: an id with a NUL byte is valid UTF-8, so lockstep accepts it, but no
// PostgreSQL text can hold it, and at run time it would fail every batch it was in (22021). A list file's NUL line is
// skipped and reported with its file:line; an inline pinned or scheduled id with one is a problem naming the
// field.
func TestNULIDsRejectedAtLoad(t *testing.T) {
	t.Run("list file", func(t *testing.T) {
		text := cfg(map[string]string{"REST": "[[hotkeys]]\nname = \"hk\"\nkeyspace = \"track\"\nfile = \"lists/ids.txt\""})
		c, err := load(t, text, map[string]string{"lists/ids.txt": "1\n2\x003\n3\n"})
		if err != nil {
			t.Fatalf("LoadEnv: %v, want the NUL line skipped", err)
		}
		h := c.HotkeysList("hk")
		if want := []string{"1", "3"}; !slices.Equal(h.IDs, want) {
			t.Errorf("IDs: got %q, want %q", h.IDs, want)
		}
		want := `lists/ids.txt:2: postgres: invalid id: "2\x003" has a NUL byte at offset 1`
		if len(h.Skipped) != 1 || !strings.HasPrefix(h.Skipped[0], want) {
			t.Errorf("Skipped: got %q, want one line starting with %q", h.Skipped, want)
		}
	})
	for _, tc := range []struct{ name, rest, want string }{
		{"inline pinned", "[[hotkeys]]\nname = \"hk\"\nkeyspace = \"track\"\nids = [\"1\", \"2\\u00003\"]",
			`hotkeys "hk": ids[1]: postgres: invalid id: "2\x003" has a NUL byte at offset 1`},
		{"inline schedule", "[[schedule]]\nname = \"s\"\ncron = \"@daily\"\nkeyspace = \"track\"\nids = [\"\\u0000\", \"1\"]",
			`schedule "s": ids[0]: postgres: invalid id: "\x00" has a NUL byte at offset 0`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, cfg(map[string]string{"REST": tc.rest}), nil)
			var ve *config.ValidationError
			if !errors.As(err, &ve) || !strings.Contains(ve.Error(), tc.want) {
				t.Errorf("LoadEnv: got %v, want a problem containing %s", err, tc.want)
			}
		})
	}
}
