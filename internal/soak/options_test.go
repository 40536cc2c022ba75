package soak_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/soak"
)

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		edit func(o *soak.Options)
		want string // in the error; "" = valid
	}{
		{"defaults", func(*soak.Options) {}, ""},
		{"control run", func(o *soak.Options) { o.Faults = "none" }, ""},
		{"a list", func(o *soak.Options) { o.Faults = "flushdb, daemon-kill9" }, ""},
		{"sentinel failover with sentinel", func(o *soak.Options) { o.Sentinel, o.Faults = true, "sentinel-failover" }, ""},
		{"sentinel and cluster", func(o *soak.Options) { o.Sentinel, o.Cluster = true, true }, "--sentinel and --cluster: pick one"},
		{"unknown fault", func(o *soak.Options) { o.Faults = "bogus" }, `unknown or unavailable fault "bogus"`},
		{"redis-link needs a single Redis", func(o *soak.Options) { o.Cluster, o.Faults = true, "redis-link" }, `unavailable fault "redis-link"`},
		{"short", func(o *soak.Options) { o.Duration = 59 * time.Second }, "--duration must be >= 1m"},
		{"no replica", func(o *soak.Options) { o.Replicas = 0 }, "--replicas"},
		{"no worker", func(o *soak.Options) { o.Workers = 0 }, "--workers"},
		{"no interval", func(o *soak.Options) { o.Interval = 0 }, "--interval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := soak.DefaultOptions()
			tt.edit(&o)
			err := o.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Validate() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestKinds(t *testing.T) {
	t.Parallel()
	got := soak.Kinds()
	for _, want := range []string{"flushdb", "daemon-kill9", "redis-link", "sentinel-failover", "cluster-migration"} {
		if !slices.Contains(got, want) {
			t.Errorf("Kinds() = %v, want %q among them", got, want)
		}
	}
	got[0] = "changed"
	if soak.Kinds()[0] == "changed" {
		t.Error("Kinds() returns the package's own slice; want a copy")
	}
}

func TestChecksError(t *testing.T) {
	t.Parallel()
	err := &soak.ChecksError{Seed: 7, Failed: []string{"a: 1", "b: 2"}}
	if got, want := err.Error(), "soak seed 7: 2 checks failed: a: 1; b: 2"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}
