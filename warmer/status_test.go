package warmer_test

import (
	"encoding/json"
	"testing"

	"github.com/keepwarm/keepwarm/warmer"
)

// TestKeyspaceStatusJSONNames: KeyspaceStatus.KeyTemplate (once named Key) keeps its JSON name key_template, so
// `keepwarm status` and scripts reading /debug/hotkeys work across versions.
func TestKeyspaceStatusJSONNames(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(warmer.KeyspaceStatus{Name: "track", KeyTemplate: "track:${id}"})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if got, want := m["key_template"], "track:${id}"; got != want {
		t.Errorf("key_template = %v, want %q (in %s)", got, want, b)
	}
	if _, ok := m["key"]; ok {
		t.Errorf("JSON has a \"key\" field: %s", b)
	}
	var back warmer.KeyspaceStatus
	if err := json.Unmarshal(b, &back); err != nil || back.KeyTemplate != "track:${id}" {
		t.Errorf("round trip: KeyTemplate %q, %v; want %q", back.KeyTemplate, err, "track:${id}")
	}
}
