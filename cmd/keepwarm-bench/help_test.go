package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestHelpExitsZero: `keepwarm-bench -h` and `keepwarm-bench <command> --help` print the usage and exit 0, for
// every command the usage lists (they printed "flag: help requested" and exited 1).
func TestHelpExitsZero(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "keepwarm-bench")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var commands []string
	for _, line := range strings.Split(usage, "\n") {
		if f := strings.Fields(line); len(line) > 2 && line[:2] == "  " && line[2] != ' ' && len(f) > 1 {
			commands = append(commands, f[0])
		}
	}
	if len(commands) < 10 {
		t.Fatalf("found %d commands in the usage, want every one: %q", len(commands), commands)
	}
	for _, args := range append([][]string{{"-h"}, {"--help"}}, func() [][]string {
		var out [][]string
		for _, c := range commands {
			out = append(out, []string{c, "--help"}, []string{c, "-h"})
		}
		return out
	}()...) {
		cmd := exec.Command(bin, args...)
		cmd.Env = os.Environ()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("keepwarm-bench %s: %v, want exit 0\n%s", strings.Join(args, " "), err, out)
			continue
		}
		if !strings.Contains(strings.ToLower(string(out)), "usage") {
			t.Errorf("keepwarm-bench %s: no usage printed:\n%s", strings.Join(args, " "), out)
		}
		if strings.Contains(string(out), "help requested") {
			t.Errorf("keepwarm-bench %s: printed %q", strings.Join(args, " "), "help requested")
		}
	}
}
