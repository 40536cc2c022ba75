package statuspage

import (
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/warmer"
)

// TestStreamSection: the change stream's state is shown, escaped, and a standby's or missing stream is not an
// error.
func TestStreamSection(t *testing.T) {
	status := func(int) []warmer.KeyspaceStatus { return []warmer.KeyspaceStatus{} }
	tests := []struct {
		name   string
		stream *Stream
		want   []string
		absent []string
	}{
		{"streaming", &Stream{Role: "holder", State: "streaming", Slot: "keepwarm", Publication: "keepwarm",
			AckedLSN: "0/1E45FF8", LagBytes: 120, LagSeconds: 0.25, Received: 42, Resyncs: 1,
			LastCommit: time.Date(2026, 11, 30, 20, 6, 54, 589e6, time.UTC)},
			[]string{`<table id="stream">`, "<td>holder</td><td>streaming</td>", "0/1E45FF8", "120 B, 0.25 s", "<td>42</td>", "20:06:54.589"},
			[]string{`class="bad"`}},
		{"failing", &Stream{Role: "holder", State: "connecting", Slot: "keepwarm", LastError: `<b>refused</b>`},
			[]string{`<td class="bad">connecting</td>`, "last error: &lt;b&gt;refused&lt;/b&gt;", "never"}, []string{"<b>refused"}},
		{"standby", &Stream{Role: "standby", State: "stopped"}, []string{"<td>standby</td><td>stopped</td>"}, []string{`class="bad"`}},
		{"unpublished", &Stream{Role: "holder", State: "streaming", Unpublished: []string{"public.track", "public.album"}},
			[]string{`the publication lacks feeding tables <span class="key">public.track</span>, <span class="key">public.album</span>`}, nil},
		{"off", nil, nil, []string{`id="stream"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, body := render(t, Config{Status: status, Stream: func() *Stream { return tt.stream }})
			for _, w := range tt.want {
				if !strings.Contains(body, w) {
					t.Errorf("page lacks %q", w)
				}
			}
			for _, a := range tt.absent {
				if strings.Contains(body, a) {
					t.Errorf("page contains %q", a)
				}
			}
		})
	}
}
