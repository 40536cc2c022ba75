package statuspage

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/warmer"
)

var now = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)

func render(t *testing.T, cfg Config) (*http.Response, string) {
	t.Helper()
	cfg.Now = func() time.Time { return now }
	rec := httptest.NewRecorder()
	New(cfg).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	return rec.Result(), rec.Body.String()
}

func TestPageEscapesKeysAndValues(t *testing.T) {
	evil := `<script>alert("x")</script>'&`
	status := func(int) []warmer.KeyspaceStatus {
		return []warmer.KeyspaceStatus{{
			Name: `ks"<b>`, KeyTemplate: `k:<i>${id}`, Tracked: 3, Hot: 2,
			Keys: []warmer.KeyStatus{
				{ID: evil, Key: "k:" + evil, TTL: 3 * time.Second, Pinned: true, LastError: `<img src=x onerror="boom">`},
				{ID: "nl", Key: "k:line\nbreak\x00", TTL: 4 * time.Second},
			},
		}}
	}
	sched := func(context.Context) []Schedule {
		return []Schedule{{Name: `<svg onload=alert(1)>`, Keyspace: "ks", Cron: "@every 1m", LastResult: `"ok"`}}
	}
	resp, body := render(t, Config{Status: status, Schedules: sched, Version: `v1<2>`})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s", resp.Status)
	}
	for _, bad := range []string{"<script", "<img", "<svg onload", "<b>", "<i>", `"ok"`, "\x00"} {
		if strings.Contains(body, bad) {
			t.Errorf("page contains %q unescaped", bad)
		}
	}
	for _, want := range []string{
		"k:&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&#39;&amp;",
		`&#34;k:line\nbreak\x00&#34;`, // control characters: shown Go-quoted
		"error: &lt;img src=x onerror=&#34;boom&#34;&gt;",
		"&lt;svg onload=alert(1)&gt;",
		"v1&lt;2&gt;",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	for h, want := range map[string]string{
		"Content-Type":            "text/html; charset=utf-8",
		"Content-Security-Policy": csp,
		"Cache-Control":           "no-store",
		"X-Content-Type-Options":  "nosniff",
	} {
		if got := resp.Header.Get(h); got != want {
			t.Errorf("header %s = %q, want %q", h, got, want)
		}
	}
}

func TestPageSections(t *testing.T) {
	keys := []warmer.KeyStatus{
		{ID: "1", Key: "track:1", TTL: 1200 * time.Millisecond, Score: 12.5, NextRefresh: now.Add(200 * time.Millisecond),
			LastRebuild: 3 * time.Millisecond, LastRefresh: now.Add(-8 * time.Second), Pinned: true},
		{ID: "2", Key: "track:2", TTL: 9 * time.Second, Score: 3},
		{ID: "3", Key: "track:3", Missing: true},
	}
	status := func(int) []warmer.KeyspaceStatus {
		return []warmer.KeyspaceStatus{
			{Name: "album", KeyTemplate: "album:${id}", Refreshes: map[string]int64{}},
			{Name: "track", KeyTemplate: "track:${id}", Tracked: 40, Hot: 3, Due: 1, HotExpired: 2, Keys: keys,
				Refreshes: map[string]int64{"error": 4, "ok": 100, "locked": 7, "zzz": 1}},
		}
	}
	for _, tc := range []struct {
		name      string
		cfg       Config
		want      []string
		wantNot   []string
		wantTitle string
	}{
		{
			name: "running",
			cfg: Config{Status: status, Ready: func(context.Context) error { return nil }, Refresh: 3 * time.Second,
				Schedules: func(context.Context) []Schedule {
					return []Schedule{{Name: "charts", Keyspace: "track", Cron: "0 30 7 * * mon-fri",
						Next: now.Add(90 * time.Minute), Last: now.Add(-22 * time.Hour), LastResult: "ok"}}
				}},
			want: []string{
				`<meta http-equiv="refresh" content="3">`,
				`class="slo bad" id="slo">hot keys expired before their refresh: 2<`,
				`<span>ok 100</span><span>locked 7</span><span>error 4</span><span>zzz 1</span>`,
				`id="ready">ready<`,
				`<td class="key">track:1</td><td class="num">1.2s</td><td class="num">in 200ms</td><td class="num">12.5</td>`,
				`8.0s ago`, `pinned`, `missing at origin`,
				`<rect class="bar"`, `2 keys`, `1 with no known expiry`,
				`<td>charts</td><td>track</td><td class="key">0 30 7 * * mon-fri</td>`,
				`in 1h30m`, `22h00m ago`,
				`No hot key with a known TTL yet.`, // album has none
			},
			wantTitle: "keepwarm (2 hot keys expired)",
		},
		{
			name:    "starting, no schedules wired",
			cfg:     Config{Status: func(int) []warmer.KeyspaceStatus { return nil }, Ready: func(context.Context) error { return errors.New("redis: connection refused") }},
			want:    []string{`id="starting"`, `not ready: redis: connection refused`, `content="5"`},
			wantNot: []string{`id="schedules"`, `id="slo"`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, body := render(t, tc.cfg)
			for _, w := range tc.want {
				if !strings.Contains(body, w) {
					t.Errorf("page lacks %q", w)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(body, w) {
					t.Errorf("page has %q", w)
				}
			}
			if tc.wantTitle != "" && !strings.Contains(body, "<title>"+tc.wantTitle+"</title>") {
				t.Errorf("page title is not %q", tc.wantTitle)
			}
			if t.Failed() {
				t.Logf("page:\n%s", body)
			}
		})
	}
}

func TestHistogram(t *testing.T) {
	ttls := func(ds ...time.Duration) []warmer.KeyStatus {
		out := make([]warmer.KeyStatus, len(ds))
		for i, d := range ds {
			out[i] = warmer.KeyStatus{TTL: d}
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		keys     []warmer.KeyStatus
		wantSpan string
		wantBars []int // counts of the non-empty bars, in order
		wantMax  int
		unknown  int
	}{
		{"empty", nil, "", nil, 0, 0},
		{"unknown only", ttls(0, 0), "", nil, 0, 2},
		{"bunched", ttls(9*time.Second, 9*time.Second, 9*time.Second, time.Second), "10.0s", []int{1, 3}, 3, 0},
		{"spread by jitter", ttls(10*time.Second, 10600*time.Millisecond, 11200*time.Millisecond), "15.0s", []int{1, 1, 1}, 1, 0},
		{"the longest lands in the last bar", ttls(time.Minute), "1m00s", []int{1}, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHistogram(tc.keys, DefaultBins)
			var got []int
			for _, b := range h.Bars {
				got = append(got, b.N)
				if b.H <= 0 || b.Y < 0 || b.Y+b.H > histH+0.001 || b.X < histLeft || b.X+b.W > histLeft+histW {
					t.Errorf("bar out of the plot: %+v", b)
				}
			}
			if h.Span != tc.wantSpan || !slices.Equal(got, tc.wantBars) || h.Max != tc.wantMax || h.Unknown != tc.unknown {
				t.Errorf("got span %q bars %v max %d unknown %d, want %q %v %d %d", h.Span, got, h.Max, h.Unknown,
					tc.wantSpan, tc.wantBars, tc.wantMax, tc.unknown)
			}
		})
	}
}

func TestRoundUp(t *testing.T) {
	for _, tc := range []struct{ in, want time.Duration }{
		{300 * time.Millisecond, 500 * time.Millisecond},
		{2 * time.Second, 2 * time.Second},
		{9500 * time.Millisecond, 10 * time.Second},
		{11 * time.Second, 15 * time.Second},
		{40 * time.Minute, time.Hour},
		{90 * time.Minute, 2 * time.Hour},
	} {
		if got := roundUp(tc.in); got != tc.want {
			t.Errorf("roundUp(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestPrintable(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"track:1", "track:1"},
		{"ключ:ü 😀", "ключ:ü 😀"},
		{"a\tb", `"a\tb"`},
		{"bad\xffutf8", `"bad\xffutf8"`},
	} {
		if got := Printable(tc.in); got != tc.want {
			t.Errorf("Printable(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
