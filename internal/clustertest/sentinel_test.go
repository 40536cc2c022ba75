package clustertest

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/warmer"
)

// sentinelMaster asks the first Sentinel that answers for the master's address.
func sentinelMaster(t *testing.T) string {
	t.Helper()
	for _, a := range testenv.SentinelAddrs() {
		s := redis.NewSentinelClient(&redis.Options{Addr: a})
		addr, err := s.GetMasterAddrByName(context.Background(), testenv.SentinelMasterName()).Result()
		s.Close()
		if err == nil && len(addr) == 2 {
			return net.JoinHostPort(addr[0], addr[1])
		}
	}
	t.Fatalf("no Sentinel of %v names master %q", testenv.SentinelAddrs(), testenv.SentinelMasterName())
	return ""
}

func role(c *redis.Client) string {
	r, err := c.Do(context.Background(), "ROLE").Slice()
	if err != nil || len(r) == 0 {
		return ""
	}
	s, _ := r[0].(string)
	return s
}

// TestSentinelFailoverUnderLoad: the daemon keeps 40 hot keys warm through a Sentinel failover client while apps
// read them and the origin's rows change every 200 ms; SENTINEL FAILOVER promotes the replica. The old master
// stays a master with its stale copies for about 10 s, until Sentinel demotes it, and goes on publishing their
// expiries. The daemon follows the new master, subscribes there (noticing the new run_id) and sets its
// notify-keyspace-events (a replica never had them: CONFIG SET is not replicated); no hot key expires and none
// is counted as expired or vanished on the old master's word; no value goes backwards once the failover is over
// (a publish with a stale token would); the apps' misses and errors, if any, fall in the failover window and are
// reported.
func TestSentinelFailoverUnderLoad(t *testing.T) {
	rdb := testenv.SentinelClient(t)
	p := testenv.Prefix(t, rdb)
	f := newFixture(t, rdb, 40, p+"item:${id}")
	ctx := context.Background()
	cfg := f.config(4*time.Second, 2*time.Second)
	d := startDaemon(t, rdb, cfg)
	f.bumpEvery(t, 200*time.Millisecond)
	old := sentinelMaster(t)
	testenv.Eventually(t, 15*time.Second, "every key written, notifications on", func() bool {
		return d.refreshed(t) >= 40 && d.w.NotificationsHealthy()
	})
	r := f.startReaders(t, 3, cfg.TTL, 2*time.Millisecond)
	testenv.Eventually(t, 5*time.Second, "apps reading", func() bool { return r.hits.Load() > 100 })
	missesBefore, errsBefore := r.misses.Load(), r.errs.Load()

	r.window.Store(true)
	start := time.Now()
	s := redis.NewSentinelClient(&redis.Options{Addr: testenv.SentinelAddrs()[0]})
	defer s.Close()
	if err := s.Failover(ctx, testenv.SentinelMasterName()).Err(); err != nil {
		t.Fatalf("SENTINEL FAILOVER %s: %v", testenv.SentinelMasterName(), err)
	}
	var promoted string
	testenv.Eventually(t, 20*time.Second, "the Sentinels name a new master", func() bool {
		promoted = sentinelMaster(t)
		return promoted != old && role(node(t, promoted)) == "master"
	})
	promotedIn := time.Since(start)
	testenv.Eventually(t, 20*time.Second, "the daemon subscribed on the new master and set its flags", func() bool {
		flags, err := node(t, promoted).ConfigGet(ctx, "notify-keyspace-events").Result()
		return err == nil && warmer.MissingNotifyFlags(flags["notify-keyspace-events"]) == "" && d.w.NotificationsHealthy() &&
			strings.Contains(d.logs.String(), "the server changed (failover); subscribing again")
	})
	resubscribedIn := time.Since(start)
	testenv.Eventually(t, 30*time.Second, "Sentinel demoted the old master", func() bool { return role(node(t, old)) == "slave" })
	demotedIn := time.Since(start)
	// The window closes once the apps' client talks to the new master and the old one is a replica.
	testenv.Eventually(t, 20*time.Second, "the apps' client follows the new master", func() bool {
		info, err := rdb.Info(ctx, "server").Result()
		_, port, _ := net.SplitHostPort(promoted)
		return err == nil && strings.Contains(info, "tcp_port:"+port)
	})
	r.window.Store(false)
	windowLen := time.Since(start)
	missesIn, errsIn := r.misses.Load()-missesBefore, r.errs.Load()-errsBefore
	after := d.refreshed(t)
	testenv.Eventually(t, 20*time.Second, "every key refreshed twice after the failover", func() bool { return d.refreshed(t) >= after+80 })
	d.slo(t)
	if r.regressions.Load() != 0 {
		t.Errorf("apps: %v; want no value going backwards outside the failover window", r)
	}
	if missesBefore != 0 || errsBefore != 0 {
		t.Errorf("before the failover: %d misses, %d errors; want none", missesBefore, errsBefore)
	}
	if extra := r.misses.Load() - missesBefore - missesIn; extra != 0 {
		t.Errorf("after the failover window: %d misses; want none (apps: %v)", extra, r)
	}
	if extra := r.errs.Load() - errsBefore - errsIn; extra != 0 {
		t.Errorf("after the failover window: %d errors; want none (apps: %v)", extra, r)
	}
	t.Logf("SENTINEL FAILOVER %s -> %s: promoted after %v, daemon subscribed there with flags after %v, old master demoted after %v, window %v; in the window: %d misses, %d errors; %s; apps: %v",
		old, promoted, promotedIn.Round(time.Millisecond), resubscribedIn.Round(time.Millisecond), demotedIn.Round(time.Millisecond),
		windowLen.Round(time.Millisecond), missesIn, errsIn, errorReasons(t, d), r)
}
