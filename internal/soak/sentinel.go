package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/redisserver"
)

// sentinelMaster is the master name of the soak's Sentinel group.
const sentinelMaster = "keepwarm-soak"

// redisNode is one redis-server process of the soak's Sentinel group (a data node or a Sentinel), restarted by the
// nemesis on the same port.
type redisNode struct {
	port int
	dir  string

	mu   sync.Mutex // guards cmd and done
	cmd  *exec.Cmd
	done chan struct{}
}

func (n *redisNode) addr() string { return "127.0.0.1:" + strconv.Itoa(n.port) }

// start runs redis-server with args (after the common ones) and waits until it answers PING.
func (n *redisNode) start(ctx context.Context, args ...string) error {
	// No diskless-sync delay: a node restarted as a replica copies the primary at once instead of after 5 s.
	all := append([]string{"--port", strconv.Itoa(n.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--repl-diskless-sync-delay", "0", "--dir", n.dir, "--logfile", filepath.Join(n.dir, "redis.log")}, args...)
	return n.run(ctx, all...)
}

func (n *redisNode) run(ctx context.Context, args ...string) error {
	cmd := exec.Command("redis-server", args...)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server (scripts/services up installs it): %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	n.mu.Lock()
	n.cmd, n.done = cmd, done
	n.mu.Unlock()
	if err := redisserver.WaitPing(ctx, n.addr()); err != nil {
		return fmt.Errorf("redis-server on %s: %w", n.addr(), err)
	}
	return nil
}

func (n *redisNode) pid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// stop ends the process with sig (SIGCONT first, in case it is paused) and waits for it.
func (n *redisNode) stop(sig syscall.Signal) {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// sentinelGroup is the soak's own Sentinel group (--sentinel): a primary, one replica and three Sentinels
// (quorum 2, down-after 2 s), as scripts/services starts the shared one, on free loopback ports.
type sentinelGroup struct {
	dir       string
	nodes     []*redisNode
	sentinels []*redisNode
}

func startSentinelGroup(ctx context.Context, stderr io.Writer) (*sentinelGroup, error) {
	dir, err := os.MkdirTemp("", "keepwarm-soak-sentinel-")
	if err != nil {
		return nil, err
	}
	g := &sentinelGroup{dir: dir}
	newNode := func(name string) (*redisNode, error) {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		d := filepath.Join(dir, name)
		return &redisNode{port: port, dir: d}, os.MkdirAll(d, 0o755)
	}
	for i := range 2 {
		n, err := newNode(fmt.Sprintf("node%d", i))
		if err != nil {
			g.stop()
			return nil, err
		}
		var args []string
		if i > 0 {
			args = []string{"--replicaof", "127.0.0.1", strconv.Itoa(g.nodes[0].port)}
		}
		if err := n.start(ctx, args...); err != nil {
			g.stop()
			return nil, err
		}
		g.nodes = append(g.nodes, n)
	}
	for i := range 3 {
		n, err := newNode(fmt.Sprintf("sentinel%d", i))
		if err != nil {
			g.stop()
			return nil, err
		}
		conf := filepath.Join(n.dir, "sentinel.conf")
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
			"sentinel monitor %s 127.0.0.1 %d 2\nsentinel down-after-milliseconds %[4]s 2000\n"+
			"sentinel failover-timeout %[4]s 10000\nsentinel parallel-syncs %[4]s 1\n",
			n.port, n.dir, filepath.Join(n.dir, "sentinel.log"), sentinelMaster, g.nodes[0].port)
		if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
			g.stop()
			return nil, err
		}
		if err := n.run(ctx, conf, "--sentinel"); err != nil {
			g.stop()
			return nil, err
		}
		g.sentinels = append(g.sentinels, n)
	}
	fmt.Fprintf(stderr, "soak: private Sentinel group: primary %s, replica %s, Sentinels %v (%s)\n",
		g.nodes[0].addr(), g.nodes[1].addr(), g.sentinelAddrs(), dir)
	return g, nil
}

func (g *sentinelGroup) sentinelAddrs() []string {
	var out []string
	for _, s := range g.sentinels {
		out = append(out, s.addr())
	}
	return out
}

// master asks the Sentinels for the current primary and returns its node.
func (g *sentinelGroup) master(ctx context.Context) (*redisNode, error) {
	var errs []error
	for _, s := range g.sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
		addr, err := c.GetMasterAddrByName(ctx, sentinelMaster).Result()
		c.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		hp := net.JoinHostPort(addr[0], addr[1])
		for _, n := range g.nodes {
			if n.addr() == hp {
				return n, nil
			}
		}
		return nil, fmt.Errorf("the Sentinels name %s, which is none of the soak's nodes", hp)
	}
	return nil, fmt.Errorf("no Sentinel named the primary: %w", errors.Join(errs...))
}

func (g *sentinelGroup) stop() {
	for _, n := range append(append([]*redisNode{}, g.sentinels...), g.nodes...) {
		n.stop(syscall.SIGTERM)
	}
	os.RemoveAll(g.dir)
}

// failover kills the primary with SIGKILL, waits (up to 30 s) until the Sentinels have promoted the replica, and
// starts the killed node again as a replica of the new primary.
func (g *sentinelGroup) failover(ctx context.Context) (string, error) {
	old, err := g.master(ctx)
	if err != nil {
		return "", err
	}
	t0 := time.Now()
	old.stop(syscall.SIGKILL)
	var cur *redisNode
	for time.Since(t0) < 30*time.Second && ctx.Err() == nil {
		if cur, err = g.master(ctx); err == nil && cur != old {
			break
		}
		sleep(ctx, 100*time.Millisecond)
	}
	promoted := time.Since(t0)
	if cur == nil || cur == old {
		// Bring the node back anyway, so that the group has a primary again.
		return "", errors.Join(fmt.Errorf("no failover within 30 s of killing %s", old.addr()), old.start(context.Background()))
	}
	if err := old.start(context.Background(), "--replicaof", "127.0.0.1", strconv.Itoa(cur.port)); err != nil {
		return "", err
	}
	return fmt.Sprintf("killed %s, %s promoted after %v", old.addr(), cur.addr(), promoted.Round(100*time.Millisecond)), nil
}

// restartMaster stops the primary (SIGTERM) and starts it again empty on the same port, faster than the
// Sentinels' down-after: no failover, and the replica resynchronises from the empty primary.
func (g *sentinelGroup) restartMaster(ctx context.Context) (string, error) {
	n, err := g.master(ctx)
	if err != nil {
		return "", err
	}
	t0 := time.Now()
	n.stop(syscall.SIGTERM)
	if err := n.start(context.Background()); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s down %v", n.addr(), time.Since(t0).Round(time.Millisecond)), nil
}

// quietRedisLog drops go-redis's own log lines (a failover makes every pooled connection log its failed dials);
// the soak reports what the failover did from what it observes.
type quietRedisLog struct{}

func (quietRedisLog) Printf(context.Context, string, ...any) {}
