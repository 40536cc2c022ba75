package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"image/png"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/warmer"
)

// `make statuspage-screenshot` sets this to docs/statuspage.png.
var screenshot = flag.String("statuspage.screenshot", "", "write the status page test's screenshot (PNG) to this file")

// evilID is pinned in keyspace artist: the page must show it as text, never run or parse it.
const evilID = `<script>alert("x")</script>'"&`

// chromium returns the path of a Chromium (or Chrome) binary: $KEEPWARM_CHROMIUM, or the first found in PATH.
// The test fails when there is none: a browser test that skips would hide a broken page.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("KEEPWARM_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no chromium for the status page test: install chromium: apt-get install -y chromium " +
		"(as root, `make test` does it through scripts/test-deps), or set KEEPWARM_CHROMIUM")
	return ""
}

// demoConfigFor writes the Chinook demo config (config.toml) with every key under prefix, only pinned ids hot (a
// few in every keyspace, and evilID in artist), and returns its path.
func demoConfigFor(t *testing.T, prefix string) string {
	t.Helper()
	src, err := os.ReadFile(demoConfig)
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(src)
	if n := strings.Count(cfg, "\nkey = \""); n != 4 {
		t.Fatalf("config.toml has %d `key = \"` lines, want 4 (one per keyspace); update this test", n)
	}
	// Only pinned ids are hot (top_n = 0): the shared demo access sets, which a `make load` may be filling,
	// promote nothing here.
	cfg = regexp.MustCompile(`(?m)^top_n = .*$`).ReplaceAllString(cfg, "")
	cfg = strings.ReplaceAll(cfg, "\nkey = \"", "\ntop_n = 0\nkey = \""+prefix)
	cfg = strings.ReplaceAll(cfg, "\nfile = \"examples/", "\nfile = \""+root+"/examples/")
	// No change stream: it would create the slot "keepwarm" on the shared demo database, where a `make run`
	// streams from it (the stream has tests of its own, on throwaway databases).
	if !strings.Contains(cfg, "[changes]\n") || !strings.Contains(cfg, "\nenabled = true ") {
		t.Fatal("config.toml has no [changes] enabled = true line; update this test")
	}
	cfg = strings.Replace(cfg, "\nenabled = true ", "\nenabled = false ", 1)
	cfg += fmt.Sprintf(`
[[hotkeys]]
name = "test-albums"
keyspace = "album"
ids = ["1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12"]

[[hotkeys]]
name = "test-artists"
keyspace = "artist"
ids = ["1", "22", "50", "58", "90", "150", %q]

[[hotkeys]]
name = "test-charts"
keyspace = "chart-genre"
ids = ["1", "2", "3", "4", "6", "7", "9", "14", "24"]
`, evilID)
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestStatusPageInBrowser runs the daemon on the Chinook demo and loads its status page in headless Chromium:
// every keyspace and its hot keys are listed, the expiry histograms have bars, and a key holding a <script> tag
// is shown as text and runs nothing.
func TestStatusPageInBrowser(t *testing.T) {
	// Serial: t.Setenv changes the process environment.
	browser := chromium(t)
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	t.Setenv("KEEPWARM_POSTGRES_DSN", chinookDSN(t))
	t.Setenv("KEEPWARM_REDIS_URL", testenv.RedisURL())
	t.Setenv("KEEPWARM_DAEMON_LISTEN", "127.0.0.1:0")
	logs, _ := startRun(t, demoConfigFor(t, prefix))
	addr := listenAddr(t, logs)

	// Wait until every keyspace has written its pinned keys, so that the page has something to show.
	want := map[string]int{"album": 12, "artist": 6, "chart-genre": 9, "track": 9}
	testenv.EventuallyDiag(t, 20*time.Second, "pinned keys written in every keyspace", withLog(logs, func() bool {
		resp, err := http.Get("http://" + addr + "/debug/hotkeys?limit=0")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var spaces []warmer.KeyspaceStatus
		if json.NewDecoder(resp.Body).Decode(&spaces) != nil || len(spaces) != len(want) {
			return false
		}
		for _, ks := range spaces {
			n := 0
			for _, k := range ks.Keys {
				if k.TTL > 0 && !k.Missing {
					n++
				}
			}
			if n < want[ks.Name] {
				return false
			}
		}
		return true
	}))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(browser), chromedp.UserDataDir(t.TempDir()),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 1500))
	defer cancelAlloc()
	dialogs := make(chan string, 4)
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithListener(func(ev any) {
		if d, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			select {
			case dialogs <- d.Message:
			default:
			}
		}
	}))
	defer cancelBrowser()

	type pageFacts struct {
		Title     string         `json:"title"`
		Keyspaces []string       `json:"keyspaces"`
		Keys      []string       `json:"keys"`
		Bars      map[string]int `json:"bars"`
		FlatBars  int            `json:"flatBars"`
		SVGWidth  float64        `json:"svgWidth"`
		Scripts   int            `json:"scripts"`
		SLO       string         `json:"slo"`
		Schedules []string       `json:"schedules"`
	}
	const collect = `(() => {
	  const q = (s) => Array.from(document.querySelectorAll(s));
	  const bars = {};
	  let flat = 0;
	  for (const sec of q('section.keyspace')) {
	    const rects = Array.from(sec.querySelectorAll('svg.hist rect.bar'));
	    bars[sec.dataset.keyspace] = rects.length;
	    flat += rects.filter(r => !(r.getBBox().height > 0 && r.getBBox().width > 0)).length;
	  }
	  const svg = document.querySelector('svg.hist');
	  return {
	    title: document.title,
	    keyspaces: q('#keyspaces tr[data-keyspace]').map(tr => tr.dataset.keyspace),
	    keys: q('tr.hotkey td.key').map(td => td.textContent),
	    bars: bars, flatBars: flat,
	    svgWidth: svg ? svg.getBoundingClientRect().width : 0,
	    scripts: document.scripts.length,
	    slo: (document.getElementById('slo') || {}).textContent || '',
	    schedules: q('#schedules tr td:first-child').map(td => td.textContent),
	  };
	})()`
	if err := chromedp.Do(bctx,
		chromedp.Navigate("http://"+addr+"/"),
		chromedp.WaitVisible(chromedp.CSS("svg.hist rect.bar")),
	); err != nil {
		t.Fatalf("chromium: load the status page: %v\ndaemon log:\n%s", err, logs)
	}
	got, err := chromedp.Run(bctx, chromedp.Evaluate[pageFacts](collect))
	if err != nil {
		t.Fatalf("chromium: inspect the page: %v", err)
	}
	shot, err := chromedp.Run(bctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("chromium: screenshot: %v", err)
	}

	if got.Title != "keepwarm" && !strings.HasPrefix(got.Title, "keepwarm (") {
		t.Errorf("title %q", got.Title)
	}
	if w := []string{"album", "artist", "chart-genre", "track"}; strings.Join(got.Keyspaces, ",") != strings.Join(w, ",") {
		t.Errorf("keyspaces on the page: %q, want %q", got.Keyspaces, w)
	}
	keys := strings.Join(got.Keys, "\n")
	for _, k := range []string{"track:1", "track:3503", "album:12", "artist:58", "chart:genre:24", "artist:" + evilID} {
		if !strings.Contains(keys, "\n"+prefix+k+"\n") && !strings.HasPrefix(keys, prefix+k+"\n") && !strings.HasSuffix(keys, "\n"+prefix+k) {
			t.Errorf("hot key %q not on the page", prefix+k)
		}
	}
	for ks := range want {
		if got.Bars[ks] == 0 {
			t.Errorf("keyspace %s: the expiry histogram has no bars", ks)
		}
	}
	if got.FlatBars != 0 || got.SVGWidth < 100 {
		t.Errorf("histogram not rendered: %d bars without area, svg %.0f px wide", got.FlatBars, got.SVGWidth)
	}
	if got.Scripts != 0 {
		t.Errorf("the page has %d <script> elements, want 0", got.Scripts)
	}
	if !slices.Equal(got.Schedules, []string{"charts-before-work"}) {
		t.Errorf("schedules on the page: %q, want config.toml's charts-before-work", got.Schedules)
	}
	if !strings.Contains(got.SLO, "hot keys expired before their refresh:") {
		t.Errorf("SLO badge = %q", got.SLO)
	}
	select {
	case msg := <-dialogs:
		t.Errorf("a dialog opened: %q: the page ran a script", msg)
	default:
	}

	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1280 || b.Dy() < 800 {
		t.Errorf("screenshot is %v, want 1280 px wide and at least 800 high", b)
	}
	if *screenshot != "" {
		if err := os.WriteFile(*screenshot, shot, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot written to %s", *screenshot)
	}
}
