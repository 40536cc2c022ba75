package soak

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterGroup is the soak's own Redis Cluster (--cluster): three masters without replicas, cluster-node-timeout
// 2 s, on free loopback ports.
type clusterGroup struct {
	dir   string
	nodes []*redisNode
	args  []string // each node's cluster arguments, for restarts
}

func startCluster(ctx context.Context, stderr io.Writer) (*clusterGroup, error) {
	dir, err := os.MkdirTemp("", "keepwarm-soak-cluster-")
	if err != nil {
		return nil, err
	}
	g := &clusterGroup{dir: dir, args: []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "yes"}}
	var addrs []string
	for i := range 3 {
		port, err := freePort()
		if err != nil {
			g.stop()
			return nil, err
		}
		n := &redisNode{port: port, dir: filepath.Join(dir, fmt.Sprintf("node%d", i))}
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			g.stop()
			return nil, err
		}
		if err := n.start(ctx, g.args...); err != nil {
			g.stop()
			return nil, err
		}
		g.nodes = append(g.nodes, n)
		addrs = append(addrs, n.addr())
	}
	create := exec.CommandContext(ctx, "redis-cli", append(append([]string{"--cluster", "create"}, addrs...), "--cluster-yes")...)
	if out, err := create.CombinedOutput(); err != nil {
		g.stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %w: %s", err, out)
	}
	for _, n := range g.nodes {
		if err := n.waitClusterOK(ctx, 30*time.Second); err != nil {
			g.stop()
			return nil, err
		}
	}
	fmt.Fprintf(stderr, "soak: private Redis Cluster %v (%s)\n", addrs, dir)
	return g, nil
}

// waitClusterOK waits until the node reports cluster_state:ok.
func (n *redisNode) waitClusterOK(ctx context.Context, timeout time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: n.addr(), MaxRetries: -1})
	defer c.Close()
	var info string
	for t0 := time.Now(); time.Since(t0) < timeout; {
		info, _ = c.ClusterInfo(ctx).Result()
		if strings.Contains(info, "cluster_state:ok") {
			return nil
		}
		sleep(ctx, 200*time.Millisecond)
	}
	return fmt.Errorf("cluster node %s not ok within %v: %.200s", n.addr(), timeout, info)
}

func (g *clusterGroup) addrs() []string {
	var out []string
	for _, n := range g.nodes {
		out = append(out, n.addr())
	}
	return out
}

func (g *clusterGroup) stop() {
	for _, n := range g.nodes {
		n.stop(syscall.SIGTERM)
	}
	os.RemoveAll(g.dir)
}

// restart stops the node (SIGTERM) and starts it again: it keeps its slots (nodes.conf) and loses its keys.
func (g *clusterGroup) restart(ctx context.Context, n *redisNode) (string, error) {
	t0 := time.Now()
	n.stop(syscall.SIGTERM)
	if err := n.start(context.Background(), g.args...); err != nil {
		return "", err
	}
	down := time.Since(t0)
	return fmt.Sprintf("%s down %v", n.addr(), down.Round(time.Millisecond)), n.waitClusterOK(ctx, 30*time.Second)
}

// migrate moves the slots of up to max of keys (hot keys) from the master that serves the first of them to
// another master, the way a resharding does: one slot after the other, each key by key (MIGRATE) with pause
// between keys, then CLUSTER SETSLOT NODE on the target, the source and the other master.
func (g *clusterGroup) migrate(ctx context.Context, cc *redis.ClusterClient, keys []string, max int, pause time.Duration) (string, error) {
	type master struct {
		c    *redis.Client
		id   string
		addr string
	}
	var ms []master
	for _, n := range g.nodes {
		c := redis.NewClient(&redis.Options{Addr: n.addr()})
		defer c.Close()
		id, err := c.Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return "", err
		}
		ms = append(ms, master{c, id, n.addr()})
	}
	slots, err := cc.ClusterSlots(ctx).Result() //lint:ignore SA1019 CLUSTER SHARDS is Redis 7.0+; the daemon supports 6.2, whose only map is CLUSTER SLOTS
	if err != nil {
		return "", err
	}
	owner := func(slot int) int {
		for _, s := range slots {
			if slot >= s.Start && slot <= s.End {
				for i, m := range ms {
					if m.addr == s.Nodes[0].Addr {
						return i
					}
				}
			}
		}
		return -1
	}
	src := -1
	var move []int
	for _, k := range keys {
		slot := int(cc.ClusterKeySlot(ctx, k).Val())
		o := owner(slot)
		if o < 0 || (src >= 0 && o != src) || slices.Contains(move, slot) {
			continue
		}
		src = o
		move = append(move, slot)
		if len(move) == max {
			break
		}
	}
	if src < 0 {
		return "no hot key's slot found", nil
	}
	dst := (src + 1) % len(ms)
	host, port, _ := net.SplitHostPort(ms[dst].addr)
	moved := 0
	for _, slot := range move {
		if err := ms[dst].c.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", ms[src].id).Err(); err != nil {
			return "", fmt.Errorf("SETSLOT %d IMPORTING: %w", slot, err)
		}
		if err := ms[src].c.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", ms[dst].id).Err(); err != nil {
			return "", fmt.Errorf("SETSLOT %d MIGRATING: %w", slot, err)
		}
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; {
			ks, err := ms[src].c.ClusterGetKeysInSlot(ctx, slot, 1).Result()
			if err != nil {
				return "", err
			}
			if len(ks) == 0 {
				break
			}
			err = ms[src].c.Migrate(ctx, host, port, ks[0], 0, 5*time.Second).Err()
			if err == nil {
				moved++
			} else if !strings.Contains(err.Error(), "NOKEY") {
				return "", fmt.Errorf("MIGRATE %s: %w", ks[0], err)
			}
			sleep(ctx, pause)
		}
		for _, i := range []int{dst, src, 3 - src - dst} {
			if err := ms[i].c.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ms[dst].id).Err(); err != nil {
				return "", fmt.Errorf("SETSLOT %d NODE on %s: %w", slot, ms[i].addr, err)
			}
		}
	}
	return fmt.Sprintf("%d slots, %d keys %s -> %s", len(move), moved, ms[src].addr, ms[dst].addr), nil
}

// clusterConfig writes a copy of the demo config for a Redis Cluster: every key template gets its id as a hash
// tag ("track:${id}" becomes "track:{${id}}"), so that a key, its lock, stale copy and meta hash share a slot as
// lockstep's scripts require, and relative hotkeys files become absolute (the copy lives elsewhere).
func clusterConfig(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	s := regexp.MustCompile(`(?m)^(key\s*=\s*")([^"]*)\$\{id\}"`).ReplaceAllString(string(b), `${1}${2}{$${id}}"`)
	abs, err := filepath.Abs(src)
	if err != nil {
		return err
	}
	dir := filepath.Dir(abs)
	s = regexp.MustCompile(`(?m)^(file\s*=\s*")([^"/][^"]*)"`).ReplaceAllStringFunc(s, func(m string) string {
		i := strings.Index(m, `"`)
		return m[:i+1] + filepath.Join(dir, strings.Trim(m[i:], `"`)) + `"`
	})
	return os.WriteFile(dst, []byte(s), 0o644)
}
