// Package pgserver runs private PostgreSQL clusters (initdb + pg_ctl on a loopback port) and physical standbys of
// them, for tests and for keepwarm-bench: anything that changes server-wide settings (synchronous_standby_names),
// restarts or promotes a server, or needs another major version than the shared server of scripts/services. It
// does not import package testing; the test-facing wrapper is testenv.PrivatePostgres.
//
// As root, PostgreSQL refuses to run, so the cluster runs as the postgres user (which Debian's postgresql package
// creates) with its files in a temporary directory that user owns.
package pgserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// User is the superuser every private cluster is created with (trust authentication on loopback).
const User = "keepwarm"

// Options configures Start. The zero value runs the newest PostgreSQL installed, on a free port.
type Options struct {
	// BinDir holds initdb, pg_ctl and postgres. Default: $KEEPWARM_PG_BINDIR, else the directory of pg_ctl on
	// PATH, else the newest /usr/lib/postgresql/*/bin. A lib directory beside it (BinDir/../lib, as in the
	// embedded-postgres builds that `scripts/services up pg17` fetches) is put on LD_LIBRARY_PATH.
	BinDir string
	// Port is the loopback port; 0 takes a free one.
	Port int
	// Settings are extra server settings (written to postgresql.conf, where ALTER SYSTEM still overrides them),
	// on top of the defaults: wal_level=logical, 10 replication slots and WAL senders, fsync and
	// full_page_writes off, synchronous_commit off.
	Settings map[string]string
	// XidEpoch, when set, starts the cluster's transaction ids in that epoch (pg_resetwal -e), so that 64-bit
	// transaction ids (xid8) differ from their low 32 bits, as on a server that has run for long.
	XidEpoch uint32
}

// Server is one private cluster: a primary from Start, or a standby from AddStandby.
type Server struct {
	base, data string
	port       int
	bin        string
	lib        string // "" or the lib directory for LD_LIBRARY_PATH
	osUser     string // "" = this user
	major      int
}

// Start creates a cluster with initdb and starts it, waiting until it accepts connections (pg_ctl -w, at most
// 60 s). The error says how to install PostgreSQL when its binaries are missing. The caller removes the cluster
// with Remove.
func Start(ctx context.Context, opts Options) (*Server, error) {
	s, err := newServer(opts)
	if err != nil {
		return nil, err
	}
	if out, err := s.cmd(ctx, "initdb", "-D", s.data, "-U", User, "--auth=trust", "-E", "UTF8", "--locale=C").CombinedOutput(); err != nil {
		s.Remove()
		return nil, fmt.Errorf("initdb in %s (is PostgreSQL installed? scripts/services up installs it): %w: %s", s.bin, err, out)
	}
	set := map[string]string{}
	for k, v := range defaultSettings {
		set[k] = v
	}
	for k, v := range opts.Settings {
		set[k] = v
	}
	if err := s.writeSettings(set); err != nil {
		s.Remove()
		return nil, err
	}
	if opts.XidEpoch > 0 {
		if out, err := s.cmd(ctx, "pg_resetwal", "-e", strconv.FormatUint(uint64(opts.XidEpoch), 10), "-D", s.data).CombinedOutput(); err != nil {
			s.Remove()
			return nil, fmt.Errorf("pg_resetwal -e %d: %w: %s", opts.XidEpoch, err, out)
		}
	}
	if err := s.Start(ctx); err != nil {
		s.Remove()
		return nil, err
	}
	return s, nil
}

func newServer(opts Options) (*Server, error) {
	bin := opts.BinDir
	if bin == "" {
		var err error
		if bin, err = findBinDir(); err != nil {
			return nil, err
		}
	}
	port := opts.Port
	if port == 0 {
		var err error
		if port, err = freePort(); err != nil {
			return nil, err
		}
	}
	base, err := os.MkdirTemp("", "keepwarm-pg-")
	if err != nil {
		return nil, fmt.Errorf("make the cluster's directory: %w", err)
	}
	s := &Server{base: base, data: filepath.Join(base, "data"), port: port, bin: bin}
	if lib := filepath.Join(filepath.Dir(bin), "lib"); isDir(filepath.Join(lib, "postgresql")) && !strings.HasPrefix(bin, "/usr/lib/postgresql/") {
		s.lib = lib
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(base)
			return nil, fmt.Errorf("running as root, PostgreSQL needs the postgres user (scripts/services up creates it with the package): %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(base, uid, gid); err != nil {
			os.RemoveAll(base)
			return nil, err
		}
		s.osUser = "postgres"
	}
	return s, nil
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// findBinDir finds the PostgreSQL server binaries (see Options.BinDir).
func findBinDir() (string, error) {
	if d := os.Getenv("KEEPWARM_PG_BINDIR"); d != "" {
		return d, nil
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(p), "initdb")); err == nil {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("pgserver: no PostgreSQL server binaries (pg_ctl, initdb) found: run `scripts/services up`, which installs them, or apt-get install postgresql")
}

func versionOf(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// cmd runs a PostgreSQL binary of the cluster's installation, as the cluster's owner.
func (s *Server) cmd(ctx context.Context, name string, args ...string) *exec.Cmd {
	argv := append([]string{filepath.Join(s.bin, name)}, args...)
	if s.lib != "" {
		argv = append([]string{"env", "LD_LIBRARY_PATH=" + s.lib}, argv...)
	}
	if s.osUser != "" {
		argv = append([]string{"runuser", "-u", s.osUser, "--"}, argv...)
	}
	return exec.CommandContext(ctx, argv[0], argv[1:]...)
}

// Port is the server's loopback port.
func (s *Server) Port() int { return s.port }

// DataDir is the cluster's data directory.
func (s *Server) DataDir() string { return s.data }

// LogFile is the server's log.
func (s *Server) LogFile() string { return filepath.Join(s.base, "postgres.log") }

// DSN is the URL of database db on the server, as User, without TLS.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", User, s.port, db)
}

// Major is the server's major version (15, 17, ...), read when it first started.
func (s *Server) Major() int { return s.major }

// defaultSettings are every private cluster's settings, before Options.Settings.
var defaultSettings = map[string]string{
	"listen_addresses": "127.0.0.1", "max_connections": "100", "wal_level": "logical",
	"max_replication_slots": "10", "max_wal_senders": "10", "fsync": "off", "synchronous_commit": "off",
	"full_page_writes": "off",
}

// Start starts the (stopped) server and waits until it accepts connections.
func (s *Server) Start(ctx context.Context) error {
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -c port=%d -c unix_socket_directories=%s", s.port, s.base)
	out, err := s.cmd(ctx, "pg_ctl", "-D", s.data, "-l", s.LogFile(), "-w", "-t", "60", "-o", opts, "start").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl start on port %d: %w: %s (log %s)", s.port, err, out, s.LogFile())
	}
	if s.major == 0 {
		conn, err := pgx.Connect(ctx, s.DSN("postgres"))
		if err != nil {
			return fmt.Errorf("connect to the private server on port %d: %w", s.port, err)
		}
		defer conn.Close(context.WithoutCancel(ctx))
		var num int
		if err := conn.QueryRow(ctx, "select current_setting('server_version_num')::int").Scan(&num); err != nil {
			return fmt.Errorf("read server_version_num: %w", err)
		}
		s.major = num / 10000
	}
	return nil
}

// writeSettings appends settings (sorted by name) to the cluster's postgresql.conf, where ALTER SYSTEM (Reload)
// can still override them, unlike command-line options.
func (s *Server) writeSettings(settings map[string]string) error {
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString("\n# pgserver\n")
	for _, k := range keys {
		v := settings[k]
		if !strings.HasPrefix(v, "'") {
			v = quote(v)
		}
		fmt.Fprintf(&b, "%s = %s\n", k, v)
	}
	f, err := os.OpenFile(filepath.Join(s.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("write settings: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString(b.String()); err != nil {
		return fmt.Errorf("write settings: %w", err)
	}
	return nil
}

// Stop stops the server; mode is pg_ctl's -m: "fast" (a clean shutdown) or "immediate" (a crash).
func (s *Server) Stop(ctx context.Context, mode string) error {
	out, err := s.cmd(ctx, "pg_ctl", "-D", s.data, "-m", mode, "-w", "-t", "60", "stop").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl stop -m %s: %w: %s", mode, err, out)
	}
	return nil
}

// Running reports whether the server's postmaster.pid exists (it started and has not stopped).
func (s *Server) Running() bool {
	_, err := os.Stat(filepath.Join(s.data, "postmaster.pid"))
	return err == nil
}

// Remove stops the server if it runs (immediately, on a fresh context: it runs on the way out) and deletes its
// files.
func (s *Server) Remove() {
	if s.Running() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		_ = s.Stop(ctx, "immediate")
		cancel()
	}
	os.RemoveAll(s.base)
}

// Exec runs sql on database db of the server, on a connection of its own.
func (s *Server) Exec(ctx context.Context, db, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, s.DSN(db))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

// Reload sets server-wide settings with ALTER SYSTEM and reloads the configuration (pg_reload_conf), for
// settings that need no restart (synchronous_standby_names, say). An empty value resets the setting.
func (s *Server) Reload(ctx context.Context, settings map[string]string) error {
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for k, v := range settings {
		q := fmt.Sprintf("alter system set %s = %s", pgx.Identifier{k}.Sanitize(), quote(v))
		if v == "" {
			q = fmt.Sprintf("alter system reset %s", pgx.Identifier{k}.Sanitize())
		}
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	if _, err := conn.Exec(ctx, "select pg_reload_conf()"); err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	return nil
}

func quote(v string) string { return "'" + strings.ReplaceAll(v, "'", "''") + "'" }

// StandbyOptions configures AddStandby.
type StandbyOptions struct {
	// Name is the standby's application_name, which synchronous_standby_names names, and its physical
	// replication slot on the primary.
	Name string
	// Sync makes the standby synchronous: the primary's synchronous_standby_names is set to Name (and
	// synchronous_commit to on), so that every commit waits for the standby's confirmation.
	Sync bool
	// Settings are the standby's extra server settings (sync_replication_slots, hot_standby_feedback, ...).
	Settings map[string]string
}

// AddStandby makes a physical streaming standby of s: it stops s cleanly, copies its data directory (a cold base
// backup, which needs no pg_basebackup of the same version), starts s again with a physical replication slot for
// the standby, and starts the standby with primary_conninfo and primary_slot_name pointing at s. It returns once
// the standby streams (pg_stat_replication on s lists it, within 60 s). The caller removes the standby with Remove.
func (s *Server) AddStandby(ctx context.Context, opts StandbyOptions) (*Server, error) {
	if opts.Name == "" || !identRE(opts.Name) {
		return nil, fmt.Errorf("pgserver: standby name %q: want lower-case letters, digits and _", opts.Name)
	}
	settings := map[string]string{}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	settings["hot_standby"] = "on"
	settings["primary_conninfo"] = fmt.Sprintf("'host=127.0.0.1 port=%d user=%s dbname=postgres application_name=%s'", s.port, User, opts.Name)
	settings["primary_slot_name"] = opts.Name
	sb, err := newServer(Options{BinDir: s.bin})
	if err != nil {
		return nil, err
	}
	if err := s.Stop(ctx, "fast"); err != nil {
		sb.Remove()
		return nil, err
	}
	copyErr := func() error {
		if out, err := exec.CommandContext(ctx, "cp", "-a", s.data, sb.data).CombinedOutput(); err != nil {
			return fmt.Errorf("copy the data directory: %w: %s", err, out)
		}
		for _, f := range []string{"postmaster.pid", "postmaster.opts"} {
			os.Remove(filepath.Join(sb.data, f))
		}
		if err := sb.writeSettings(settings); err != nil {
			return err
		}
		return touchAs(filepath.Join(sb.data, "standby.signal"), s.data)
	}()
	if err := s.Start(ctx); err != nil {
		sb.Remove()
		return nil, err
	}
	if copyErr != nil {
		sb.Remove()
		return nil, copyErr
	}
	if err := s.Exec(ctx, "postgres", "select pg_create_physical_replication_slot($1, true)", opts.Name); err != nil {
		sb.Remove()
		return nil, fmt.Errorf("create the standby's slot: %w", err)
	}
	if err := sb.Start(ctx); err != nil {
		sb.Remove()
		return nil, err
	}
	if err := s.waitStandby(ctx, opts.Name); err != nil {
		sb.Remove()
		return nil, err
	}
	if opts.Sync {
		if err := s.Reload(ctx, map[string]string{"synchronous_standby_names": opts.Name, "synchronous_commit": "on"}); err != nil {
			sb.Remove()
			return nil, err
		}
	}
	return sb, nil
}

func identRE(s string) bool {
	for i, r := range s {
		if !(r >= 'a' && r <= 'z' || r == '_' || (i > 0 && r >= '0' && r <= '9')) {
			return false
		}
	}
	return len(s) <= 63
}

// touchAs creates an empty file at path with the owner of like.
func touchAs(path, like string) error {
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		return err
	}
	if fi, err := os.Stat(like); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			return os.Chown(path, int(st.Uid), int(st.Gid))
		}
	}
	return nil
}

// waitStandby waits until pg_stat_replication lists the standby as streaming.
func (s *Server) waitStandby(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, s.DSN("postgres"))
		if err == nil {
			var n int
			err = conn.QueryRow(ctx, "select count(*) from pg_stat_replication where application_name = $1 and state = 'streaming'", name).Scan(&n)
			conn.Close(context.WithoutCancel(ctx))
			if err == nil && n > 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("standby %q did not stream within 60 s (last error %v; see its log)", name, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Promote promotes a standby to a primary (pg_ctl promote -w).
func (s *Server) Promote(ctx context.Context) error {
	out, err := s.cmd(ctx, "pg_ctl", "-D", s.data, "-w", "-t", "60", "promote").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl promote: %w: %s", err, out)
	}
	return nil
}
