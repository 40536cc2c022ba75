package statuspage

import (
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/warmer"
)

// TestPageShowsInvalidBytesEscaped: keys with invalid UTF-8 are shown with their bytes escaped (\xff), never as
// U+FFFD; two different bad keys, and a valid key that merely looks like an escaped one, stay distinguishable.
func TestPageShowsInvalidBytesEscaped(t *testing.T) {
	keys := []string{"item:\xff\xfe1", "item:\xff\xfd1", `"item:\xff\xfe1"`}
	status := func(int) []warmer.KeyspaceStatus {
		st := warmer.KeyspaceStatus{Name: "items", KeyTemplate: "item:${id}", Hot: len(keys), Refreshes: map[string]int64{}}
		for i, k := range keys {
			st.Keys = append(st.Keys, warmer.KeyStatus{ID: strings.TrimPrefix(k, "item:"), Key: k, TTL: time.Duration(i+1) * time.Second})
		}
		return []warmer.KeyspaceStatus{st}
	}
	_, body := render(t, Config{Status: status})
	if strings.ContainsRune(body, 0xFFFD) || strings.Contains(body, "\xff") {
		t.Error("page shows U+FFFD or raw invalid bytes")
	}
	for _, want := range []string{
		`<td class="key">&#34;item:\xff\xfe1&#34;</td>`,
		`<td class="key">&#34;item:\xff\xfd1&#34;</td>`,
		`<td class="key">&#34;\&#34;item:\\xff\\xfe1\&#34;&#34;</td>`,
	} {
		if n := strings.Count(body, want); n != 1 {
			t.Errorf("page shows %s %d times, want once", want, n)
		}
	}
}
