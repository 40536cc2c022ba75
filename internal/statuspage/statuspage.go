package statuspage

import (
	"bytes"
	"cmp"
	"context"
	_ "embed"
	"fmt"
	"html/template"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/keepwarm/keepwarm/warmer"
)

// Defaults of Config.
const (
	DefaultRefresh       = 5 * time.Second // the page reloads itself this often
	DefaultKeys          = 50              // hot keys listed per keyspace
	DefaultHistogramKeys = 10000           // hot keys (nearest expiry first) counted in each histogram
	DefaultBins          = 30              // bars per histogram
)

// Schedule is one cron-driven warmup as the page shows it.
type Schedule struct {
	Name       string
	Keyspace   string
	Cron       string    // the spec as configured, e.g. "0 30 7 * * mon-fri"
	Next       time.Time // zero when unknown
	Last       time.Time // zero before the first run
	LastResult string    // e.g. "ok", "failed", "skipped: ran elsewhere"; "" before the first run
}

// Stream is the change stream (PostgreSQL logical replication) as the page shows it.
type Stream struct {
	Role        string // "holder" (this daemon streams), "standby", "stopped"
	State       string // "streaming", "connecting", "resync", "stopped"
	Slot        string
	Publication string
	AckedLSN    string
	LagBytes    int64
	LagSeconds  float64
	Received    int64
	Resyncs     int64
	LastCommit  time.Time // zero before the first applied transaction
	LastError   string
	// Unpublished are the feeding tables the publication lacks: their changes do not arrive.
	Unpublished []string
}

// Config configures the page. Status is required.
type Config struct {
	// Status returns the keyspaces with up to limit hot keys each, nearest expiry first (warmer.Warmer.Status).
	// It returns nil while the daemon is starting.
	Status func(limit int) []warmer.KeyspaceStatus
	// Ready reports whether the daemon is ready (the /readyz check); nil omits the line. Called with a 2 s
	// deadline.
	Ready func(context.Context) error
	// Degraded lists the parts of the job not being done while the daemon is ready (the same list /readyz
	// reports); nil or empty omits the section. It must not do I/O.
	Degraded func() []string
	// Schedules returns the cron schedules, asked with the page request's context; nil omits the section.
	Schedules func(context.Context) []Schedule
	// Stream returns the change stream's state (change-driven refresh); nil, or a nil result, omits the section.
	Stream  func() *Stream
	Version string        // shown in the header
	Refresh time.Duration // meta refresh period; default DefaultRefresh
	Keys    int           // hot keys listed per keyspace; default DefaultKeys
	// HistogramKeys bounds the hot keys counted in each expiry histogram; default DefaultHistogramKeys.
	HistogramKeys int
	Now           func() time.Time // default time.Now
	Logger        *slog.Logger     // default slog.Default()
}

// Handler serves the page. Build it with New.
type Handler struct {
	cfg Config
}

// New returns the page's handler. It panics if cfg.Status is nil (a programming error).
func New(cfg Config) *Handler {
	if cfg.Status == nil {
		panic("statuspage: nil Status")
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = DefaultRefresh
	}
	if cfg.Keys <= 0 {
		cfg.Keys = DefaultKeys
	}
	if cfg.HistogramKeys <= 0 {
		cfg.HistogramKeys = DefaultHistogramKeys
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Handler{cfg: cfg}
}

//go:embed page.html.tmpl
var pageText string

var pageTmpl = template.Must(template.New("page").Funcs(template.FuncMap{
	"f1":   func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) },
	"sub1": func(v float64) float64 { return v - 4 },              // count label, left of the plot
	"addW": func(v float64) float64 { return v + histW },          // x axis end
	"addB": func(v float64) float64 { return v + histBottom - 5 }, // time labels, under the plot
}).Parse(pageText))

// csp allows no script, no fetch and no frame: the page is inert HTML and inline CSS.
const csp = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'; " +
	"frame-ancestors 'none'"

// ServeHTTP renders the page.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := h.build(r.Context())
	var buf bytes.Buffer
	if err := pageTmpl.Execute(&buf, p); err != nil {
		h.cfg.Logger.Error("status page: render", "error", err)
		http.Error(w, "status page: render failed", http.StatusInternalServerError)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	hd.Set("Cache-Control", "no-store")
	hd.Set("Content-Security-Policy", csp)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	_, _ = w.Write(buf.Bytes())
}

// page is what the template renders.
type page struct {
	Version    string
	Now        string
	Refresh    int // seconds
	Starting   bool
	Ready      string // "" when cfg.Ready is nil
	ReadyOK    bool
	Degraded   []string
	Keyspaces  []keyspaceView
	HotExpired int64 // sum over keyspaces
	Schedules  []scheduleView
	ShowSched  bool
	Stream     *Stream
}

type keyspaceView struct {
	Name, KeyTemplate string
	Tracked, Hot, Due int
	Results           []resultCount
	Errors            int64 // refreshes with result error
	KeyErrors         int   // listed hot keys whose last refresh failed
	HotExpired        int64
	CheckError        string // the keyspace's query check fails: nothing is refreshed (see warmer.Checker)
	Keys              []keyView
	Listed, Counted   int // keys listed in the table; keys counted in the histogram
	Hist              histogram
}

type resultCount struct {
	Result string
	N      int64
}

type keyView struct {
	Key, ID                        string
	TTL, Next, Score, Rebuilt, Ago string
	Note, NoteClass                string
}

type scheduleView struct {
	Name, Keyspace, Cron            string
	Next, NextAt, Last, LastAt, Res string
}

func (h *Handler) build(ctx context.Context) page {
	now := h.cfg.Now()
	p := page{Version: h.cfg.Version, Now: now.UTC().Format(time.RFC3339), Refresh: int(math.Ceil(h.cfg.Refresh.Seconds()))}
	if h.cfg.Ready != nil {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := h.cfg.Ready(rctx)
		cancel()
		p.ReadyOK = err == nil
		p.Ready = "ready"
		if err != nil {
			p.Ready = "not ready: " + err.Error()
		}
	}
	if h.cfg.Degraded != nil {
		p.Degraded = h.cfg.Degraded()
	}
	spaces := h.cfg.Status(h.cfg.HistogramKeys)
	p.Starting = spaces == nil
	for _, ks := range spaces {
		v := keyspaceView{Name: ks.Name, KeyTemplate: ks.KeyTemplate, Tracked: ks.Tracked, Hot: ks.Hot, Due: ks.Due,
			Errors: ks.Refreshes[warmer.ResultError], HotExpired: ks.HotExpired, Counted: len(ks.Keys),
			CheckError: ks.CheckError}
		p.HotExpired += ks.HotExpired
		v.Results = results(ks.Refreshes)
		v.Hist = newHistogram(ks.Keys, DefaultBins)
		for i, k := range ks.Keys {
			if k.LastError != "" {
				v.KeyErrors++
			}
			if i < h.cfg.Keys {
				v.Keys = append(v.Keys, viewKey(k, now))
			}
		}
		v.Listed = len(v.Keys)
		p.Keyspaces = append(p.Keyspaces, v)
	}
	if h.cfg.Stream != nil {
		p.Stream = h.cfg.Stream()
	}
	if h.cfg.Schedules != nil {
		p.ShowSched = true
		for _, s := range h.cfg.Schedules(ctx) {
			sv := scheduleView{Name: s.Name, Keyspace: s.Keyspace, Cron: s.Cron, Next: "-", Last: "never", Res: s.LastResult}
			if !s.Next.IsZero() {
				sv.Next, sv.NextAt = "in "+short(s.Next.Sub(now)), s.Next.UTC().Format(time.RFC3339)
			}
			if !s.Last.IsZero() {
				sv.Last, sv.LastAt = short(now.Sub(s.Last))+" ago", s.Last.UTC().Format(time.RFC3339)
			}
			if sv.Res == "" {
				sv.Res = "-"
			}
			p.Schedules = append(p.Schedules, sv)
		}
	}
	return p
}

// resultOrder is the order of the refresh results on the page; others follow by name.
var resultOrder = []string{warmer.ResultOK, warmer.ResultFresh, warmer.ResultLocked, warmer.ResultMissing,
	warmer.ResultLockLost, warmer.ResultLockGone, warmer.ResultTooLarge, warmer.ResultError}

func results(m map[string]int64) []resultCount {
	out := make([]resultCount, 0, len(m))
	for r, n := range m {
		out = append(out, resultCount{r, n})
	}
	rank := func(r string) int {
		if i := slices.Index(resultOrder, r); i >= 0 {
			return i
		}
		return len(resultOrder)
	}
	slices.SortFunc(out, func(a, b resultCount) int {
		return cmp.Or(cmp.Compare(rank(a.Result), rank(b.Result)), cmp.Compare(a.Result, b.Result))
	})
	return out
}

func viewKey(k warmer.KeyStatus, now time.Time) keyView {
	v := keyView{Key: Printable(k.Key), ID: Printable(k.ID), TTL: "-", Next: "-", Rebuilt: "-", Ago: "-",
		Score: strconv.FormatFloat(k.Score, 'f', 1, 64)}
	if k.TTL > 0 {
		v.TTL = short(k.TTL)
	}
	switch {
	case k.Refreshing:
		v.Next = "refreshing now"
	case !k.NextRefresh.IsZero():
		if d := k.NextRefresh.Sub(now); d > 0 {
			v.Next = "in " + short(d)
		} else {
			v.Next = "due"
		}
	}
	if k.LastRebuild > 0 {
		v.Rebuilt = k.LastRebuild.Round(100 * time.Microsecond).String()
	}
	if !k.LastRefresh.IsZero() {
		v.Ago = short(now.Sub(k.LastRefresh)) + " ago"
	}
	switch {
	case k.LastError != "":
		v.Note, v.NoteClass = "error: "+Printable(k.LastError), "bad"
	case k.Persistent:
		v.Note, v.NoteClass = "no TTL: left alone", "warn"
	case k.Missing:
		v.Note, v.NoteClass = "missing at origin", "warn"
	case k.Pinned:
		v.Note = "pinned"
	}
	return v
}

// Printable returns s as is when it is valid UTF-8 without control or other non-graphic characters, and
// Go-quoted otherwise, so that a key with a newline, a NUL or invalid bytes is shown exactly (`"k:\xff"`, never
// U+FFFD). A string that starts with a double quote is quoted too, so the mapping is one-to-one: a shown value
// is the key itself, or, when it starts with a quote, the key Go-quoted. Two different keys never look alike.
// HTML escaping is html/template's job, not this function's.
func Printable(s string) string {
	if !utf8.ValidString(s) || strings.HasPrefix(s, `"`) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !unicode.IsGraphic(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// short formats a duration for people: 850ms, 4.2s, 1m05s, 2h10m.
func short(d time.Duration) string {
	switch {
	case d < 0:
		d = 0
		fallthrough
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	default:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
}
