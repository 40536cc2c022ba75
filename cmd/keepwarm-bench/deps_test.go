package main_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestBinaryDoesNotLinkTesting: keepwarm-bench is a shipped binary, so it must not link package testing (its
// flags and its init would come with it). The redis-server starter it uses lives in internal/redisserver for that
// reason, not in internal/testenv.
func TestBinaryDoesNotLinkTesting(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", "github.com/keepwarm/keepwarm/cmd/keepwarm-bench").Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/keepwarm-bench: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/keepwarm/keepwarm/internal/redisserver") {
		t.Errorf("deps %v: want internal/redisserver among them (is the go list query still right?)", deps)
	}
	for _, bad := range []string{"testing", "github.com/keepwarm/keepwarm/internal/testenv"} {
		if slices.Contains(deps, bad) {
			t.Errorf("keepwarm-bench links %s; move what it uses into a package that does not import testing", bad)
		}
	}
}
