package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/keepwarm/keepwarm/internal/backoff"
	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/internal/reload"
	"github.com/keepwarm/keepwarm/internal/runs"
	"github.com/keepwarm/keepwarm/internal/server"
	"github.com/keepwarm/keepwarm/internal/statuspage"
	"github.com/keepwarm/keepwarm/internal/systemd"
	"github.com/keepwarm/keepwarm/internal/wire"
	"github.com/keepwarm/keepwarm/sources/postgres"
	"github.com/keepwarm/keepwarm/warmer"
)

// version is stamped at build time: go build -ldflags "-X main.version=v1.2.3".
var version = "dev"

// connectTimeout bounds each attempt to reach Redis or PostgreSQL at start-up.
const connectTimeout = 5 * time.Second

// cmdRun is `keepwarm run`: the daemon. It keeps running on its last good config when a reload is invalid, and on
// SIGTERM/SIGINT stops scheduling, lets in-flight refreshes finish (bounded), releases its locks and exits 0.
func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "config.toml", "config file (TOML)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	log := newLogger(cfg.Daemon, stderr)
	for _, n := range cfg.Notes {
		log.Warn("config: " + n)
	}
	d, err := startDaemon(ctx, *path, cfg, log)
	if err != nil {
		return err
	}
	return d.run(ctx)
}

// daemon is one running keepwarm: its connections, warmer, HTTP server and config watcher.
type daemon struct {
	path    string
	log     *slog.Logger
	cfg     *config.Config
	rdb     redis.UniversalClient
	pool    *pgxpool.Pool
	w       *warmer.Warmer
	cron    *warmer.Cron
	srv     *server.Server
	watch   *reload.Watcher
	reg     *prometheus.Registry
	reloads *prometheus.CounterVec
	skipped *skippedIDs   // bad lines of hot-key list files, reported at each load
	ready   chan struct{} // closed once Redis and PostgreSQL answered and the warmer is built
}

// newLogger returns the daemon's logger: JSON (default) or text, at the configured level. Durations are written
// as Go duration strings ("ttl":"10s"), not as integer nanoseconds, in both formats.
func newLogger(d config.Daemon, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: d.LogLevel, ReplaceAttr: durationsAsStrings}
	if d.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// durationsAsStrings is a slog ReplaceAttr that writes time.Duration values as strings ("1.5s").
func durationsAsStrings(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// newRegistry returns the daemon's registry with the Go, process and build-info collectors.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector(),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "keepwarm_build_info", Help: "keepwarm's version, as a label; the value is always 1.",
			ConstLabels: prometheus.Labels{"version": version},
		}, func() float64 { return 1 }))
	return reg
}

func startDaemon(ctx context.Context, path string, cfg *config.Config, log *slog.Logger) (*daemon, error) {
	d := &daemon{path: path, log: log, cfg: cfg, reg: newRegistry(), ready: make(chan struct{})}
	d.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "keepwarm_config_reloads_total",
		Help: "Config reloads (SIGHUP or file change), by result (ok, error). On error the last good config stays.",
	}, []string{"result"})
	d.reg.MustRegister(d.reloads)
	d.skipped = newSkippedIDs(d.reg, log)
	var err error
	if d.srv, err = server.New(server.Config{
		Addr: cfg.Daemon.Listen, Gatherer: d.reg, Logger: log, Ready: d.readyz,
		Hotkeys: func(limit int) any {
			w := d.readyWarmer()
			if w == nil {
				return []warmer.KeyspaceStatus{}
			}
			return w.Status(limit)
		},
		// Status page: GET / (exactly; other paths stay 404).
		Extra: func(mux *http.ServeMux) {
			mux.Handle("GET /{$}", statuspage.New(statuspage.Config{
				Status: func(limit int) []warmer.KeyspaceStatus {
					if w := d.readyWarmer(); w != nil {
						return w.Status(limit)
					}
					return nil
				},
				Schedules: func() []statuspage.Schedule {
					var out []statuspage.Schedule
					if d.readyWarmer() != nil {
						for _, s := range d.cron.Status() {
							out = append(out, statuspage.Schedule{Name: s.Name, Keyspace: s.Keyspace, Cron: s.Spec,
								Next: s.Next, Last: s.Last, LastResult: s.LastResult})
						}
					}
					return out
				},
				Ready: d.readyz, Version: version, Logger: log,
			}))
			mux.HandleFunc("GET /debug/schedules", func(w http.ResponseWriter, _ *http.Request) {
				sched := []warmer.ScheduleStatus{}
				if d.readyWarmer() != nil {
					sched = d.cron.Status()
				}
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(sched)
			})
		},
	}); err != nil {
		return nil, fmt.Errorf("daemon: listen %s: %w", cfg.Daemon.Listen, err)
	}
	return d, nil
}

// readyWarmer returns the warmer once the daemon is ready, nil before. HTTP handlers use it: close(d.ready) orders
// the write of d.w before their reads.
func (d *daemon) readyWarmer() *warmer.Warmer {
	select {
	case <-d.ready:
		return d.w
	default:
		return nil
	}
}

// readyz reports whether the config is loaded, Redis and PostgreSQL answer, and every keyspace's query check
// passed; otherwise its error names each failing keyspace and its check error.
func (d *daemon) readyz(ctx context.Context) error {
	select {
	case <-d.ready:
	default:
		return errors.New("starting: waiting for redis and postgres")
	}
	if err := d.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if err := d.pool.Ping(ctx); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	if failing := d.w.Failing(); len(failing) > 0 {
		errs := make([]error, len(failing))
		for i, f := range failing {
			errs[i] = fmt.Errorf("keyspace %q: check failing since %s (%d attempts, next at %s): %s", f.Keyspace,
				f.Since.UTC().Format(time.RFC3339), f.Attempts, f.NextCheck.UTC().Format(time.RFC3339), f.Error)
		}
		return errors.Join(errs...)
	}
	return nil
}

// connect reaches Redis and PostgreSQL, retrying with jittered back-off (1s doubling up to 30s) until they
// answer or ctx ends: a daemon started before its dependencies waits for them instead of crash-looping, and a
// fleet restarted together does not retry in step.
func (d *daemon) connect(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		pause := backoff.Delay(attempt-1, time.Second, 30*time.Second, rand.Float64())
		var err error
		if d.rdb == nil {
			if d.rdb, err = wire.Redis(ctx, d.cfg, connectTimeout); err != nil {
				d.rdb = nil
			}
		}
		if err == nil && d.pool == nil {
			if d.pool, err = wire.Postgres(ctx, d.cfg, connectTimeout); err != nil {
				d.pool = nil
			}
		}
		if err == nil {
			return nil
		}
		if attempt == 1 || attempt%10 == 0 {
			d.log.Error("cannot reach a dependency; retrying", "error", err, "attempt", attempt,
				"retry_in", pause.String())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
	}
}

func (d *daemon) run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return d.srv.Run(gctx) })
	d.log.Info("keepwarm starting", "version", version, "config", d.path, "listen", d.srv.Addr(),
		"redis", d.cfg.Redis, "postgres", d.cfg.Postgres)
	d.skipped.report(d.cfg)
	if err := d.connect(gctx); err != nil {
		if ctx.Err() != nil {
			return g.Wait()
		}
		return err
	}
	defer d.rdb.Close()
	defer d.pool.Close()
	srcs, err := wire.Sources(d.pool, d.cfg, postgres.WithRegisterer(d.reg))
	if err != nil {
		return err
	}
	// Each keyspace's query is checked by the warmer before its first refresh (postgres.Source is a
	// warmer.Checker): a keyspace whose check fails (a table renamed by a migration) is retried with back-off and
	// named by /readyz and the status page, while the others run. Exiting here would crash-loop under systemd.
	d.w, err = warmer.New(d.rdb, warmer.Config{
		Keyspaces: wire.Keyspaces(d.cfg, srcs), Logger: d.log, Registerer: d.reg, Notifications: true,
		DB: d.cfg.Redis.DB,
	})
	if err != nil {
		return err
	}
	if d.cron, err = warmer.NewCron(d.w, runs.New(d.pool, ""), d.reg, d.log); err != nil {
		return err
	}
	if err := d.cron.Update(wire.Schedules(d.cfg, srcs)); err != nil {
		return err
	}
	if d.watch, err = reload.New(d.log, watchedFiles(d.cfg)); err != nil {
		return fmt.Errorf("watch config: %w", err)
	}
	keyspaces := len(d.cfg.Keyspaces) // read before the watcher starts: a reload replaces d.cfg
	close(d.ready)
	g.Go(func() error { return d.w.Run(gctx) })
	g.Go(func() error { return d.cron.Run(gctx) })
	g.Go(func() error { return d.watch.Run(gctx, d.reload) })
	d.log.Info("keepwarm running", "keyspaces", keyspaces, "listen", d.srv.Addr())
	// systemd (Type=notify): READY=1 now, STOPPING=1 when shutdown begins, and watchdog pings while the
	// scheduler makes progress. Each is a no-op outside systemd.
	if _, err := systemd.Ready(fmt.Sprintf("running: %d keyspaces, listening on %s", keyspaces, d.srv.Addr())); err != nil {
		d.log.Warn("systemd notify failed", "error", err)
	}
	g.Go(func() error { return systemd.Watchdog(gctx, d.w.Progress, d.log) })
	g.Go(func() error {
		<-gctx.Done()
		if _, err := systemd.Stopping("stopping: finishing in-flight refreshes"); err != nil {
			d.log.Warn("systemd notify failed", "error", err)
		}
		return nil
	})
	err = g.Wait()
	d.log.Info("keepwarm stopped")
	return err
}

// watchedFiles are the config file and every hot-key list file it names.
func watchedFiles(cfg *config.Config) []string {
	files := []string{cfg.Path}
	for _, h := range cfg.Hotkeys {
		if h.File != "" {
			files = append(files, h.File)
		}
	}
	return files
}

// reload re-reads the config. An invalid file is logged (every problem) and counted, and the daemon keeps its
// last good config; for a file change seen for the first time (final false) the error is only returned, since
// the writer may not be done: the watcher calls again, final, if the file stays the same. Settings that need a
// restart (connections, listen address) are reported, not applied.
func (d *daemon) reload(reason string, final bool) error {
	cfg, err := config.Load(d.path)
	if err != nil {
		if !final {
			d.log.Info("config on disk is invalid; waiting for it to settle before reporting", "reason", reason)
			return err
		}
		d.reloads.WithLabelValues("error").Inc()
		var ve *config.ValidationError
		if errors.As(err, &ve) {
			for _, p := range ve.Problems {
				d.log.Error("config reload rejected; keeping the running config", "reason", reason, "problem", p)
			}
			return err
		}
		d.log.Error("config reload failed; keeping the running config", "reason", reason, "error", err)
		return err
	}
	for _, n := range cfg.Notes {
		d.log.Warn("config: " + n)
	}
	if !reflect.DeepEqual(cfg.Redis, d.cfg.Redis) || !reflect.DeepEqual(cfg.Postgres, d.cfg.Postgres) ||
		cfg.Daemon.Listen != d.cfg.Daemon.Listen {
		d.log.Warn("config reload: [redis], [postgres] and daemon.listen changes take effect after a restart")
	}
	srcs, err := wire.Sources(d.pool, cfg, postgres.WithRegisterer(d.reg))
	if err == nil {
		err = d.w.Update(wire.Keyspaces(cfg, srcs))
	}
	if err == nil {
		err = d.cron.Update(wire.Schedules(cfg, srcs))
	}
	if err != nil {
		d.reloads.WithLabelValues("error").Inc()
		d.log.Error("config reload rejected; keeping the running config", "reason", reason, "error", err)
		return err
	}
	if err := d.watch.Watch(watchedFiles(cfg)); err != nil {
		d.log.Warn("config reload: cannot watch a hot-key file", "error", err)
	}
	d.cfg = cfg
	d.skipped.report(cfg)
	d.reloads.WithLabelValues("ok").Inc()
	d.log.Info("config reloaded", "reason", reason, "keyspaces", len(cfg.Keyspaces))
	return nil
}
