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
	"net"
	"net/http"
	"reflect"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/keepwarm/keepwarm/internal/assemble"
	"github.com/keepwarm/keepwarm/internal/backoff"
	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/internal/reload"
	"github.com/keepwarm/keepwarm/internal/runs"
	"github.com/keepwarm/keepwarm/internal/server"
	"github.com/keepwarm/keepwarm/internal/statuspage"
	"github.com/keepwarm/keepwarm/internal/systemd"
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
	routeRedisLogs(log)
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
	changes *changeStream // change-driven refresh; nil when [changes] is off
	ready   chan struct{} // closed once Redis and PostgreSQL answered and the warmer is built
	readyAt time.Time     // when ready was closed; written before the close
	// connectErr is the last failed attempt to reach Redis or PostgreSQL at start-up, for /readyz.
	connectErr atomic.Pointer[error]
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
	d.reg.MustRegister(d.reloads, newDegradedCollector(d))
	d.skipped = newSkippedIDs(d.reg, log)
	var err error
	if d.srv, err = server.New(server.Config{
		Addr: cfg.Daemon.Listen, Gatherer: d.reg, Logger: log, Ready: d.readyz, Live: d.livez, Degraded: d.degradedStrings,
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
				Schedules: func(ctx context.Context) []statuspage.Schedule {
					var out []statuspage.Schedule
					if d.readyWarmer() != nil {
						sched, _ := d.cron.Status(ctx) // nil when the page request ends first
						for _, s := range sched {
							out = append(out, statuspage.Schedule{Name: s.Name, Keyspace: s.Keyspace, Cron: s.Spec,
								Next: s.Next, Last: s.Last, LastResult: s.LastResult})
						}
					}
					return out
				},
				Stream: func() *statuspage.Stream {
					if d.readyWarmer() == nil || d.changes == nil {
						return nil
					}
					return d.changes.page()
				},
				Ready: d.readyz, Degraded: d.degradedStrings, Version: version, Logger: log,
			}))
			mux.HandleFunc("GET /debug/health", func(w http.ResponseWriter, r *http.Request) {
				ctx, cancel := context.WithTimeout(r.Context(), server.ReadyTimeout)
				defer cancel()
				h := healthStatus{Ready: "ready", Degraded: d.degradations(time.Now())}
				if err := d.readyz(ctx); err != nil {
					h.Ready = "not ready: " + err.Error()
				}
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(h)
			})
			mux.HandleFunc("GET /debug/stream", func(w http.ResponseWriter, _ *http.Request) {
				st := streamStatus{}
				if d.readyWarmer() != nil {
					st = d.changes.status()
				}
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(st)
			})
			mux.HandleFunc("GET /debug/fleet", func(w http.ResponseWriter, _ *http.Request) {
				st := warmer.FleetStatus{Members: []warmer.FleetMember{}}
				if wr := d.readyWarmer(); wr != nil {
					st = wr.Fleet()
				}
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(st)
			})
			mux.HandleFunc("GET /debug/schedules", func(w http.ResponseWriter, r *http.Request) {
				sched := []warmer.ScheduleStatus{}
				if d.readyWarmer() != nil {
					var err error
					if sched, err = d.cron.Status(r.Context()); err != nil {
						http.Error(w, err.Error(), http.StatusServiceUnavailable)
						return
					}
				}
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(sched)
			})
		},
	}); err != nil {
		return nil, fmt.Errorf("daemon: listen %s: %w", cfg.Daemon.Listen, err)
	}
	if !isLoopback(d.srv.Addr()) {
		log.Warn("daemon.listen is not loopback: /metrics, /debug/* and the status page are reachable from the network; "+
			"restrict it with a firewall or a proxy (docs/operations.md)", "listen", d.srv.Addr())
	}
	return d, nil
}

// isLoopback reports whether addr (host:port) binds to loopback only. A wildcard or a host name is not.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
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

// readyTimeout bounds each dependency's ping in /readyz: a frozen Redis makes /readyz answer "redis: no answer
// within 500ms" rather than hang for the client's read timeout.
const readyTimeout = 500 * time.Millisecond

// livezStall is how long the scheduler may go without completing a loop pass before /livez fails. A pass
// happens at least every 2 s, and takes at most a Redis read timeout or two even while Redis is frozen.
const livezStall = 30 * time.Second

// readyz reports whether the config is loaded, Redis and PostgreSQL answer, each within readyTimeout, Redis takes
// writes (warmer.WritesRefused), and every keyspace's query check passed. The error names every dependency that
// failed and each failing keyspace with its check error.
func (d *daemon) readyz(ctx context.Context) error {
	select {
	case <-d.ready:
	default:
		if p := d.connectErr.Load(); p != nil {
			if perm := assemble.Permission(*p); perm != "" {
				return fmt.Errorf("starting: waiting for redis and postgres: %s: %w", perm, *p)
			}
			return fmt.Errorf("starting: waiting for redis and postgres: %w", *p)
		}
		return errors.New("starting: waiting for redis and postgres")
	}
	// Both pings run at once, each bounded by readyTimeout. go-redis applies its own read timeout (3 s), not
	// the context's deadline, so a ping is waited for in a goroutine; one outlives the handler by at most that.
	ping := func(name string, f func(context.Context) error) func() error {
		ctx, cancel := context.WithTimeout(ctx, readyTimeout)
		done := make(chan error, 1)
		go func() { done <- f(ctx) }()
		return func() error {
			defer cancel()
			var err error
			select {
			case err = <-done: // an answer that came in time wins over a deadline passed since
			default:
				select {
				case err = <-done:
				case <-ctx.Done():
					err = ctx.Err()
				}
			}
			switch {
			case err == nil:
				return nil
			case assemble.Permission(err) != "":
				return fmt.Errorf("%s: %s: %w", name, assemble.Permission(err), err)
			case errors.Is(err, context.DeadlineExceeded):
				return fmt.Errorf("%s: no answer within %v: %w", name, readyTimeout, err)
			default:
				return fmt.Errorf("%s: %w", name, err)
			}
		}
	}
	redisErr := ping("redis", func(ctx context.Context) error { return d.rdb.Ping(ctx).Err() })
	pgErr := ping("postgres", d.pool.Ping)
	errs := []error{redisErr(), pgErr()}
	if err := d.w.WritesRefused(); err != nil { // Redis answers the ping but refuses writes: nothing is refreshed
		errs = append(errs, fmt.Errorf("%w: %s", err, writeRefusalFix(err)))
	}
	for _, f := range d.w.RefreshFailing() {
		if perm := assemble.Permission(f.Err); perm != "" {
			errs = append(errs, fmt.Errorf("keyspace %q: every refresh fails since %s (%d batches in a row): %s: %w",
				f.Keyspace, f.Since.UTC().Format(time.RFC3339), f.Batches, perm, f.Err))
		}
	}
	for _, f := range d.w.Failing() {
		errs = append(errs, fmt.Errorf("keyspace %q: check failing since %s (%d attempts, next at %s): %s", f.Keyspace,
			f.Since.UTC().Format(time.RFC3339), f.Attempts, f.NextCheck.UTC().Format(time.RFC3339), f.Error))
	}
	return errors.Join(errs...)
}

// writeRefusalFix says what causes a refusal of writes (warmer.WritesRefused) and how to fix it, in the config's
// and Redis's terms.
func writeRefusalFix(err error) string {
	var r *warmer.WriteRefusedError
	if !errors.As(err, &r) {
		return "see docs/operations.md, \"The HTTP endpoints\""
	}
	switch r.Code {
	case warmer.RefusedReadOnly:
		return `[redis] url points at a replica; point it at the primary (or use mode = "sentinel")`
	case warmer.RefusedOOM:
		return "maxmemory reached with maxmemory-policy noeviction; give Redis memory or an eviction policy (allkeys-lfu); " +
			"meanwhile hot values are extended without locks, within max_stale"
	default:
		return `the ACL user lacks write permission on keepwarm's keys; grant the keys and commands of docs/operations.md "Least privilege"`
	}
}

// livez reports whether the process and its scheduler loop are alive, without I/O. While the daemon waits for
// its dependencies it is alive; once running, the scheduler must have completed a pass within livezStall.
func (d *daemon) livez() error {
	w := d.readyWarmer()
	if w == nil {
		return nil
	}
	last := w.Progress()
	if last.Before(d.readyAt) { // no pass yet: the scheduler's time counts from start-up
		last = d.readyAt
	}
	if age := time.Since(last); age > livezStall {
		return fmt.Errorf("scheduler stalled: last loop pass %v ago", age.Round(time.Second))
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
			if d.rdb, err = assemble.Redis(ctx, d.cfg, connectTimeout); err != nil {
				d.rdb = nil
			}
		}
		if err == nil && d.pool == nil {
			if d.pool, err = assemble.Postgres(ctx, d.cfg, connectTimeout); err != nil {
				d.pool = nil
			}
		}
		if err == nil {
			return nil
		}
		d.connectErr.Store(&err)
		if perm := assemble.Permission(err); perm != "" {
			// Not an outage: retrying will not help until someone fixes the ACL, grant or password.
			if attempt == 1 || attempt%10 == 0 {
				d.log.Error("permission denied by a dependency; retrying", "error", err, "permission", perm,
					"attempt", attempt, "retry_in", pause.String())
			}
		} else if attempt == 1 || attempt%10 == 0 {
			d.log.Error("cannot reach a dependency; retrying", "error", err, "attempt", attempt, "retry_in", pause.String())
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
	if err := countRedisCommands(d.rdb, d.reg); err != nil {
		return err
	}
	if err := d.checkFeeds(gctx); err != nil {
		return err
	}
	rec := runs.New(d.pool, "")
	p, err := newParts(d.cfg, d.rdb, d.pool, rec, d.reg, d.log)
	if err != nil {
		return err
	}
	d.w, d.cron, d.changes = p.w, p.cron, p.changes
	if n, err := rec.SweepStale(ctx); err == nil && n > 0 {
		d.log.Warn("warmup runs left running by processes that stopped without finishing them are now marked interrupted",
			"runs", n)
	}
	if d.watch, err = reload.New(d.log, watchedFiles(d.cfg)); err != nil {
		return fmt.Errorf("watch config: %w", err)
	}
	keyspaces := len(d.cfg.Keyspaces) // read before the watcher starts: a reload replaces d.cfg
	d.readyAt = time.Now()
	close(d.ready)
	g.Go(func() error { return d.w.Run(gctx) })
	g.Go(func() error { return d.cron.Run(gctx) })
	g.Go(func() error { return d.watch.Run(gctx, d.reload) })
	if d.changes != nil {
		g.Go(func() error { return d.changes.run(gctx) })
	}
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

// parts are what newParts builds from a config.
type parts struct {
	w       *warmer.Warmer
	cron    *warmer.Cron
	changes *changeStream // nil when [changes] is off
}

// newParts builds the daemon's parts from cfg with every constructor `run` calls, in order, and no I/O: the
// sources over pool, the warmer over rdb, the cron with its schedules (runs recorded by rec), and the change
// stream. A config that config.Load accepts must build: FuzzConfig checks that property, with a client and a
// pool that never connect.
//
// Each keyspace's query is checked by the warmer before its first refresh (postgres.Source is a warmer.Checker):
// a keyspace whose check fails (a table renamed by a migration) is retried with back-off and named by /readyz
// and the status page, while the others run. Failing here would crash-loop under systemd.
func newParts(cfg *config.Config, rdb redis.UniversalClient, pool *pgxpool.Pool, rec warmer.RunRecorder,
	reg prometheus.Registerer, log *slog.Logger) (*parts, error) {
	srcs, err := assemble.Sources(pool, cfg, postgres.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	p := &parts{}
	p.w, err = warmer.New(rdb, warmer.Config{
		Keyspaces: assemble.Keyspaces(cfg, srcs), Logger: log, Registerer: reg,
		Notifications:   cfg.Redis.Notifications != config.NotificationsOff,
		AutoNotifyFlags: cfg.Redis.Notifications == config.NotificationsAuto,
		DB:              cfg.Redis.DB, Fleet: assemble.Fleet(cfg),
	})
	if err != nil {
		return nil, err
	}
	if p.cron, err = warmer.NewCron(p.w, rec, reg, log); err != nil {
		return nil, err
	}
	if err := p.cron.Update(assemble.Schedules(cfg, srcs)); err != nil {
		return nil, err
	}
	if p.changes, err = newChangeStream(cfg, p.w, rdb, reg, log); err != nil {
		return nil, err
	}
	return p, nil
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
// the writer may not be done: the watcher calls again, final, if the file stays the same. A valid file that
// removes a keyspace, a schedule or a hot-key list (by name, against the running config) is what a file cut short
// looks like: on a first try it returns reload.ErrSettle, so the watcher applies it only once it has stayed the
// same for the settle period (reload.DefaultSettle); a final call (SIGHUP, or the settled file) applies it at
// once. Either way an applied removal is logged with the names removed. Settings that need a restart
// (connections, listen address) are reported, not applied.
func (d *daemon) reload(reason string, final bool) error {
	cfg, err := config.Load(d.path)
	if err != nil {
		var ve *config.ValidationError
		if errors.As(err, &ve) && len(ve.Files) > 0 {
			// A list it names may not exist yet: creating it must start a check.
			if err := d.watch.Also(ve.Files); err != nil {
				d.log.Warn("config reload: cannot watch a hot-key file", "error", err)
			}
		}
		if !final {
			d.log.Info("config on disk is invalid; waiting for it to settle before reporting", "reason", reason)
			return err
		}
		d.reloads.WithLabelValues("error").Inc()
		if ve != nil {
			for _, p := range ve.Problems {
				d.log.Error("config reload rejected; keeping the running config", "reason", reason, "problem", p)
			}
			return err
		}
		d.log.Error("config reload failed; keeping the running config", "reason", reason, "error", err)
		return err
	}
	gone := removedBy(d.cfg, cfg)
	if !gone.empty() && !final {
		d.log.Info("config on disk removes keyspaces, schedules, hot-key lists or pinned ids; waiting for it to settle before applying",
			append([]any{"reason", reason}, gone.attrs()...)...)
		return reload.ErrSettle
	}
	for _, n := range cfg.Notes {
		d.log.Warn("config: " + n)
	}
	if !reflect.DeepEqual(cfg.Redis, d.cfg.Redis) || !reflect.DeepEqual(cfg.Postgres, d.cfg.Postgres) ||
		cfg.Daemon.Listen != d.cfg.Daemon.Listen || cfg.Fleet != d.cfg.Fleet {
		d.log.Warn("config reload: [redis], [postgres], [fleet] and daemon.listen changes take effect after a restart")
	}
	srcs, err := assemble.Sources(d.pool, cfg, postgres.WithRegisterer(d.reg))
	if err == nil {
		err = d.w.Update(assemble.Keyspaces(cfg, srcs))
	}
	if err == nil {
		err = d.cron.Update(assemble.Schedules(cfg, srcs))
	}
	if err == nil && d.changes != nil {
		// [changes] itself takes effect after a restart; fed_by takes effect now, on the stream too.
		if err = d.checkFeedsOf(context.Background(), cfg); err == nil {
			err = d.changes.changes.Update(cfg.ChangeKeyspaces())
		}
		if err == nil {
			err = d.changes.stream.Reconfigure(cfg.FeedingTables(), cfg.FeedColumns())
		}
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
	if !gone.empty() {
		d.log.Warn("config reload removed keyspaces, schedules, hot-key lists or pinned ids",
			append([]any{"reason", reason}, gone.attrs()...)...)
	}
	return nil
}

// removals names what applying a config over the running one drops, by name: each list in file order of the
// running config, nil when nothing of that kind goes.
type removals struct {
	keyspaces, schedules, hotkeys []string
	// unpinned names the lists that stay but lose ids, "name (lost N of M ids)": a hot-key file cut short (a
	// writer that paused after two lines of fifty) looks like that.
	unpinned []string
}

// removedBy returns what cfg drops of old's keyspaces, [[schedule]]s and [[hotkeys]] lists.
func removedBy(old, cfg *config.Config) removals {
	var r removals
	for _, ks := range old.Keyspaces {
		if cfg.Keyspace(ks.Name) == nil {
			r.keyspaces = append(r.keyspaces, ks.Name)
		}
	}
	for _, s := range old.Schedules {
		if !slices.ContainsFunc(cfg.Schedules, func(n *config.Schedule) bool { return n.Name == s.Name }) {
			r.schedules = append(r.schedules, s.Name)
		}
	}
	for _, h := range old.Hotkeys {
		nh := cfg.HotkeysList(h.Name)
		if nh == nil {
			r.hotkeys = append(r.hotkeys, h.Name)
			continue
		}
		kept := make(map[string]bool, len(nh.IDs))
		for _, id := range nh.IDs {
			kept[id] = true
		}
		lost := 0
		for _, id := range h.IDs {
			if !kept[id] {
				lost++
			}
		}
		if lost > 0 {
			r.unpinned = append(r.unpinned, fmt.Sprintf("%s (lost %d of %d ids)", h.Name, lost, len(h.IDs)))
		}
	}
	return r
}

func (r removals) empty() bool {
	return len(r.keyspaces)+len(r.schedules)+len(r.hotkeys)+len(r.unpinned) == 0
}

// attrs are the log attributes naming the removals: "keyspaces", "schedules", "hotkeys", each only when not
// empty.
func (r removals) attrs() []any {
	var out []any
	for _, kv := range []struct {
		key   string
		names []string
	}{{"keyspaces", r.keyspaces}, {"schedules", r.schedules}, {"hotkeys", r.hotkeys}, {"unpinned", r.unpinned}} {
		if len(kv.names) > 0 {
			out = append(out, kv.key, kv.names)
		}
	}
	return out
}
