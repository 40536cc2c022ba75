package soak

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"github.com/keepwarm/keepwarm/examples/chinook"
	"github.com/keepwarm/keepwarm/internal/pgserver"
)

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// privatePostgres is the soak's own PostgreSQL cluster (internal/pgserver: initdb + pg_ctl on a loopback port,
// as the postgres user when run as root), so that the nemesis can restart it, take it down, and give it a
// synchronous standby without touching anyone else's server.
type privatePostgres struct {
	srv     *pgserver.Server
	standby *pgserver.Server // nil unless addStandby ran
	stalled atomic.Int64     // the pid of the standby's walreceiver while pg-sync-standby-stall has it stopped
}

func startPostgres(ctx context.Context, stderr io.Writer) (*privatePostgres, error) {
	srv, err := pgserver.Start(ctx, pgserver.Options{})
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stderr, "soak: private PostgreSQL %d on 127.0.0.1:%d (%s)\n", srv.Major(), srv.Port(), srv.DataDir())
	return &privatePostgres{srv: srv}, nil
}

// addStandby gives the cluster a synchronous physical standby (pgserver.AddStandby, which restarts the primary
// once): from then on every commit waits for the standby's confirmation, which the pg-sync-standby-stall fault
// withholds.
func (pg *privatePostgres) addStandby(ctx context.Context, stderr io.Writer) error {
	sb, err := pg.srv.AddStandby(ctx, pgserver.StandbyOptions{Name: "soak_standby", Sync: true})
	if err != nil {
		return fmt.Errorf("add a synchronous standby: %w", err)
	}
	pg.standby = sb
	fmt.Fprintf(stderr, "soak: synchronous standby on 127.0.0.1:%d (%s)\n", sb.Port(), sb.DataDir())
	return nil
}

func (pg *privatePostgres) start(ctx context.Context) error { return pg.srv.Start(ctx) }

// stop stops the primary: mode is pg_ctl's -m (fast, immediate).
func (pg *privatePostgres) stop(ctx context.Context, mode string) error {
	return pg.srv.Stop(ctx, mode)
}

// remove stops the standby and the primary if they run and deletes their files (on a fresh context: it runs on
// the way out, after a Ctrl-C).
func (pg *privatePostgres) remove() {
	if pg.standby != nil {
		if pid := pg.stalled.Load(); pid > 0 {
			_ = syscall.Kill(int(pid), syscall.SIGCONT) // a stopped process would hold up the shutdown
		}
		pg.standby.Remove()
	}
	pg.srv.Remove()
}

// dsn is the URL of database db on the primary.
func (pg *privatePostgres) dsn(db string) string { return pg.srv.DSN(db) }

// loadDemo loads the Chinook catalog and keepwarm's schema (what `make demo-data` does on the shared server).
func (pg *privatePostgres) loadDemo(ctx context.Context, keepwarmBin, configPath string) error {
	if _, err := chinook.Load(ctx, pg.dsn("chinook")); err != nil {
		return fmt.Errorf("load chinook: %w", err)
	}
	cmd := exec.CommandContext(ctx, keepwarmBin, "migrate", "up", "--replica-identity-full", "--config", configPath)
	cmd.Env = append(os.Environ(), "KEEPWARM_POSTGRES_DSN="+pg.dsn("chinook"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("keepwarm migrate up: %w: %s", err, out)
	}
	return nil
}

// redisProxy is an in-process toxiproxy between the daemons and Redis (the apps and the observer connect to
// Redis directly), for the redis-link fault.
type redisProxy struct {
	server *toxiproxy.ApiServer
	proxy  *toxiproxy.Proxy
	n      int // names the toxics; used by the nemesis goroutine only
}

func startRedisProxy(upstream string) (*redisProxy, error) {
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(server, "soak_redis", "127.0.0.1:0", upstream)
	if err := server.Collection.Add(p, true); err != nil {
		return nil, fmt.Errorf("start toxiproxy to %s: %w", upstream, err)
	}
	return &redisProxy{server: server, proxy: p}, nil
}

func (rp *redisProxy) addr() string { return rp.proxy.Listen }

// toxic adds one toxic of typ on stream ("upstream", "downstream") at the given toxicity.
func (rp *redisProxy) toxic(typ, stream string, toxicity float64, attrs map[string]any) error {
	rp.n++
	body, err := json.Marshal(map[string]any{"name": fmt.Sprintf("%s_%s_%d", typ, stream, rp.n), "type": typ,
		"stream": stream, "toxicity": toxicity, "attributes": attrs})
	if err != nil {
		return err
	}
	_, err = rp.proxy.Toxics.AddToxicJson(strings.NewReader(string(body)))
	return err
}

func (rp *redisProxy) heal() { rp.proxy.Toxics.ResetToxics(context.Background()) }

func (rp *redisProxy) close() { _ = rp.server.Collection.Clear() }

// daemon is one replica of the soak's fleet: a keepwarm process, restarted by the nemesis under the same
// replica id and HTTP address.
type daemon struct {
	id, addr string
	bin      string
	env      []string
	config   string
	logDir   string

	mu          sync.Mutex // guards cmd, done, incarnation
	cmd         *exec.Cmd
	done        chan struct{} // closed when cmd has exited
	incarnation int
}

func (d *daemon) start() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.incarnation++
	logf, err := os.Create(filepath.Join(d.logDir, fmt.Sprintf("%s.%d.log", d.id, d.incarnation)))
	if err != nil {
		return err
	}
	cmd := exec.Command(d.bin, "run", "--config", d.config)
	cmd.Env = d.env
	cmd.Stdout, cmd.Stderr = logf, logf
	// The daemons die with the soak even if it is killed itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start daemon %s: %w", d.id, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	d.cmd, d.done = cmd, done
	return nil
}

// pid returns the current process's id and incarnation.
func (d *daemon) pid() (int, int, chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil {
		return 0, d.incarnation, nil
	}
	return d.cmd.Process.Pid, d.incarnation, d.done
}

func (d *daemon) signal(sig syscall.Signal) error {
	pid, _, _ := d.pid()
	if pid == 0 {
		return errors.New("not running")
	}
	return syscall.Kill(pid, sig)
}

// stop ends the daemon with sig and waits up to wait for it to exit (then kills it).
func (d *daemon) stop(sig syscall.Signal, wait time.Duration) {
	pid, _, done := d.pid()
	if pid == 0 {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGCONT)
	_ = syscall.Kill(pid, sig)
	select {
	case <-done:
	case <-time.After(wait):
		_ = syscall.Kill(pid, syscall.SIGKILL)
		<-done
	}
}

// waitReady waits until the daemon's /healthz answers 200 (it is up; /readyz may stay degraded while a fault
// lasts, which is not a reason to wait).
func (d *daemon) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		if resp, err := c.Get("http://" + d.addr + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("daemon %s did not answer /healthz on %s within %v (log in %s)", d.id, d.addr, timeout, d.logDir)
}

// counterSet holds the daemon counters the soak reads, by "name/label" (the first label's value; "" when the
// metric has none): hot_expired/<keyspace> (keepwarm_warmer_hot_expired_total, the SLO counter), late/<keyspace>
// and stale_seconds/<keyspace> (keepwarm_changes_late_total and keepwarm_changes_stale_seconds_total, the freshness
// SLO), old_ids_unknown/ (keepwarm_stream_old_ids_unknown_total), resyncs/<reason>
// (keepwarm_stream_resyncs_total) and visibility_timeouts/<keyspace>
// (keepwarm_changes_visibility_timeouts_total).
type counterSet map[string]float64

// scrapedCounters maps each metric the soak reads to its short name in a counterSet.
var scrapedCounters = map[string]string{
	"keepwarm_warmer_hot_expired_total":          "hot_expired",
	"keepwarm_changes_late_total":                "late",
	"keepwarm_changes_stale_seconds_total":       "stale_seconds",
	"keepwarm_stream_old_ids_unknown_total":      "old_ids_unknown",
	"keepwarm_stream_resyncs_total":              "resyncs",
	"keepwarm_changes_visibility_timeouts_total": "visibility_timeouts",
}

// of returns the values of one short name, by label.
func (c counterSet) of(name string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range c {
		if n, label, _ := strings.Cut(k, "/"); n == name {
			out[label] += v
		}
	}
	return out
}

// sub returns c − base, key by key.
func (c counterSet) sub(base counterSet) counterSet {
	out := counterSet{}
	for k, v := range c {
		out[k] = v - base[k]
	}
	return out
}

// scrapeCounters reads the soak's counters from a daemon's /metrics.
func scrapeCounters(addr string) (counterSet, error) {
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	return parseCounters(resp.Body)
}

// parseCounters reads the samples of scrapedCounters from a Prometheus text page.
func parseCounters(r io.Reader) (counterSet, error) {
	out := counterSet{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, "{")
		labels := ""
		if ok {
			labels, rest, ok = strings.Cut(rest, "} ")
		} else {
			name, rest, ok = strings.Cut(line, " ")
		}
		short := scrapedCounters[name]
		if !ok || short == "" {
			continue
		}
		label := ""
		if labels != "" {
			first, _, _ := strings.Cut(labels, ",")
			if _, v, ok := strings.Cut(first, `="`); ok {
				label = strings.TrimSuffix(v, `"`)
			}
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			continue
		}
		out[short+"/"+label] += f
	}
	return out, sc.Err()
}

// parseHotExpired reads keepwarm_warmer_hot_expired_total{keyspace="x"} samples from a Prometheus text page.
func parseHotExpired(r io.Reader) (map[string]float64, error) {
	c, err := parseCounters(r)
	return c.of("hot_expired"), err
}

// vmHWM returns a process's peak resident set (VmHWM in /proc/PID/status), in bytes.
func vmHWM(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb << 10, err
			}
		}
	}
	return 0, errors.New("no VmHWM")
}

// manifestMemoryLimit reads the container's memory limit from deploy/kubernetes/deployment.yaml (the first
// "memory:" under "limits:"), in bytes.
func manifestMemoryLimit(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	inLimits := false
	for _, line := range strings.Split(string(b), "\n") {
		t := strings.TrimSpace(line)
		if t == "limits:" {
			inLimits = true
			continue
		}
		if inLimits {
			if v, ok := strings.CutPrefix(t, "memory:"); ok {
				return parseQuantity(strings.TrimSpace(v))
			}
			if !strings.HasPrefix(line, "              ") {
				inLimits = false
			}
		}
	}
	return 0, fmt.Errorf("%s: no limits.memory", path)
}

// parseQuantity parses a Kubernetes memory quantity with a binary suffix (Ki, Mi, Gi) or none.
func parseQuantity(s string) (int64, error) {
	mult := int64(1)
	for suf, m := range map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30} {
		if v, ok := strings.CutSuffix(s, suf); ok {
			s, mult = v, m
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("memory quantity %q: %w", s, err)
	}
	return n * mult, nil
}
