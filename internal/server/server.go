// Package server is the daemon's HTTP endpoint: /metrics, /livez (and its old name /healthz), /readyz and
// /debug/hotkeys.
//
// Liveness is not readiness. /livez says whether the process and its scheduler loop are alive: it does no I/O
// and answers at once, so a container runtime or Kubernetes restarts keepwarm only when it is wedged. /readyz says
// whether the dependencies answer; it fails while Redis or PostgreSQL is down, which is exactly when the
// fail-safe (stale values, extended TTLs) is working, so it must never be a liveness check.
//
// It binds to loopback by default (config [daemon] listen = "127.0.0.1:9471"); every endpoint is read-only.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// DefaultAddr is the default listen address: loopback only.
const DefaultAddr = "127.0.0.1:9471"

// ReadyTimeout bounds one /readyz check in all: its body then names what did not answer in time.
const ReadyTimeout = 2 * time.Second

// Config configures a Server.
type Config struct {
	Addr     string                      // listen address; default DefaultAddr
	Gatherer prometheus.Gatherer         // served on /metrics; required
	Ready    func(context.Context) error // nil error means ready; called per /readyz with a ReadyTimeout deadline
	// Degraded lists the parts of the job not being done while the daemon is otherwise ready (a change stream
	// that is down, say): /readyz still answers 200, and names them. It must not do I/O or block. nil: none.
	Degraded func() []string
	// Live reports whether the process and its scheduler loop are alive: nil means alive. Called per /livez; it
	// must not do I/O or block. nil Live means always alive.
	Live    func() error
	Hotkeys func(limit int) any // JSON for /debug/hotkeys?limit=N; nil disables the endpoint
	Logger  *slog.Logger        // default slog.Default()
	// Extra registers more handlers (the status page) on the same mux.
	Extra func(mux *http.ServeMux)
}

// Server serves the daemon's HTTP endpoints.
type Server struct {
	cfg Config
	srv *http.Server
	ln  net.Listener
}

// New binds cfg.Addr and returns a Server ready to Run. Binding early lets the caller fail fast (and report
// the bound address, e.g. with port 0 in tests).
func New(cfg Config) (*Server, error) {
	if cfg.Addr == "" {
		cfg.Addr = DefaultAddr
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Gatherer == nil {
		return nil, errors.New("server: nil gatherer")
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{}))
	livez := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if cfg.Live != nil {
			if err := cfg.Live(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte("not alive: " + oneLine(err) + "\n"))
				return
			}
		}
		_, _ = w.Write([]byte("ok\n"))
	}
	mux.HandleFunc("GET /livez", livez)
	mux.HandleFunc("GET /healthz", livez) // the old name, kept for existing checks
	// /readyz follows Kubernetes' convention: 503 only when this replica cannot do its job (a restart or another
	// replica would serve better), 200 otherwise; a degraded state is reported in the body, never by the code.
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		var degraded string
		if cfg.Degraded != nil {
			if d := cfg.Degraded(); len(d) > 0 {
				degraded = "degraded: " + oneLine(errors.New(strings.Join(d, "; ")))
			}
		}
		if cfg.Ready != nil {
			ctx, cancel := context.WithTimeout(r.Context(), ReadyTimeout)
			defer cancel()
			if err := cfg.Ready(ctx); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				body := "not ready: " + oneLine(err)
				if degraded != "" {
					body += "; " + degraded
				}
				_, _ = w.Write([]byte(body + "\n"))
				return
			}
		}
		if degraded != "" {
			_, _ = w.Write([]byte("ready, " + degraded + "\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	if cfg.Hotkeys != nil {
		mux.HandleFunc("GET /debug/hotkeys", func(w http.ResponseWriter, r *http.Request) {
			limit := 100
			if s := r.URL.Query().Get("limit"); s != "" {
				n, err := strconv.Atoi(s)
				if err != nil {
					http.Error(w, "limit: "+strconv.Quote(s)+" is not an integer", http.StatusBadRequest)
					return
				}
				limit = n
			}
			w.Header().Set("Content-Type", "application/json")
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			_ = enc.Encode(cfg.Hotkeys(limit))
		})
	}
	if cfg.Extra != nil {
		cfg.Extra(mux)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}, nil
}

// oneLine is err's text on one line: errors.Join's lines joined with "; ".
func oneLine(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}

// Addr returns the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Run serves until ctx ends, then shuts down within 5 s. It returns nil after a clean shutdown.
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(sctx)
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return serr
	}
	return err
}
