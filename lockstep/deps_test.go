package lockstep_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLeanDependencies: apps import lockstep, so it must not drag in Prometheus (client_golang, procfs, protobuf);
// its Recorder for Prometheus lives in lockstep/lockstepprom. Only go-redis and the standard library's kin are
// expected outside the module.
func TestLeanDependencies(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", "github.com/keepwarm/keepwarm/lockstep").Output()
	if err != nil {
		t.Fatalf("go list -deps ./lockstep: %v", err)
	}
	modules := map[string]bool{}
	for _, m := range strings.Fields(string(out)) {
		modules[m] = true
	}
	for m := range modules {
		if strings.HasPrefix(m, "github.com/prometheus/") || m == "google.golang.org/protobuf" {
			t.Errorf("lockstep depends on %s; apps that import it should not need Prometheus", m)
		}
	}
	if !modules["github.com/redis/go-redis/v9"] {
		t.Errorf("modules %v: want go-redis among them (is the go list query still right?)", modules)
	}
}
