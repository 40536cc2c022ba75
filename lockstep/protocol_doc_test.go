package lockstep_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestProtocolDocQuotesScripts keeps docs/protocol.md honest: it must quote every embedded Lua script verbatim,
// so that an app in another language can copy them from the document.
func TestProtocolDocQuotesScripts(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("..", "docs", "protocol.md"))
	if err != nil {
		t.Fatalf("read docs/protocol.md: %v", err)
	}
	scripts, err := filepath.Glob("*.lua")
	if err != nil || len(scripts) < 4 {
		t.Fatalf("found Lua scripts %v (%v), want the 4 embedded ones", scripts, err)
	}
	for _, path := range scripts {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(doc), "```lua\n"+string(src)+"```\n") {
			t.Errorf("docs/protocol.md does not quote lockstep/%s verbatim in a ```lua block; copy the file's text into it", path)
		}
	}
}
