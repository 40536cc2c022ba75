package clustertest

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
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

// failover runs SENTINEL FAILOVER and returns the promoted master's address once the Sentinels name it instead
// of old and it reports the master role.
func failover(t *testing.T, old string) string {
	t.Helper()
	s := redis.NewSentinelClient(&redis.Options{Addr: testenv.SentinelAddrs()[0]})
	defer s.Close()
	if err := s.Failover(context.Background(), testenv.SentinelMasterName()).Err(); err != nil {
		t.Fatalf("SENTINEL FAILOVER %s: %v", testenv.SentinelMasterName(), err)
	}
	var promoted string
	testenv.Eventually(t, 20*time.Second, "the Sentinels name a new master", func() bool {
		promoted = sentinelMaster(t)
		return promoted != old && role(node(t, promoted)) == "master"
	})
	return promoted
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
	promoted := failover(t, old)
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

// nearRecorder counts a lockstep Client's near hits (lockstep.NearRecorder); the rest goes to a readers.
type nearRecorder struct {
	recorder
	nearHits atomic.Int64
}

func (c *nearRecorder) NearHit(string)          { c.nearHits.Add(1) }
func (c *nearRecorder) NearBypass(string)       {}
func (c *nearRecorder) NearInvalidation(string) {}
func (c *nearRecorder) NearBytes(string, int64) {}

// TestNearCacheSentinelFailover: three app Clients on Sentinel failover clients hold a value in their near
// caches (MaxStaleness one hour); SENTINEL FAILOVER promotes the replica, and the value is changed on the new
// master while the old one is still a master (Sentinel demotes it about 10 s later), so the invalidation
// connections still subscribed there hear nothing of the change. Every reader must read the new value within
// 5 s of the write, and none the old one after the new one; the near caches come back on the new master. What
// makes it pass is lockstep's probe of the app's server (the app's client PUBLISHes to a channel only the
// invalidation connection subscribes to): without it the readers serve the old value from memory until the
// demotion's resynchronisation.
func TestNearCacheSentinelFailover(t *testing.T) {
	writer := testenv.SentinelClient(t)
	ctx := context.Background()
	p := testenv.Prefix(t, writer)
	keys, err := lockstep.NewKeys(p+"near:${id}", "", lockstep.DefaultStaleTemplate, "")
	if err != nil {
		t.Fatal(err)
	}
	cacheKey := p + "near:1"
	var origin atomic.Pointer[string]
	v1, v2 := "v1 on the old master", "v2 on the new master"
	origin.Store(&v1)
	load := func(context.Context, string) ([]byte, error) { return []byte(*origin.Load()), nil }
	var clients []*lockstep.Client
	var recs []*nearRecorder
	for range 3 {
		rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: testenv.SentinelMasterName(), SentinelAddrs: testenv.SentinelAddrs()})
		t.Cleanup(func() { _ = rdb.Close() })
		rec := &nearRecorder{recorder: recorder{r: &readers{}}}
		c, err := lockstep.New(rdb, "near", keys, load, time.Hour,
			lockstep.WithNearCache(lockstep.NearCache{MaxBytes: 1 << 20, MaxStaleness: time.Hour}), lockstep.WithRecorder(rec))
		if err != nil {
			t.Fatalf("lockstep.New with a near cache on a Sentinel failover client: %v", err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		clients, recs = append(clients, c), append(recs, rec)
	}
	servedFromMemory := func(want string) {
		t.Helper()
		for i, c := range clients {
			testenv.Eventually(t, 10*time.Second, fmt.Sprintf("client %d serves %q from memory", i, want), func() bool {
				before := recs[i].nearHits.Load()
				v, err := c.Get(ctx, "1")
				return err == nil && string(v) == want && recs[i].nearHits.Load() > before
			})
		}
	}
	servedFromMemory(v1)

	old := sentinelMaster(t)
	promoted := failover(t, old)
	_, port, _ := net.SplitHostPort(promoted)
	testenv.Eventually(t, 20*time.Second, "v2 written on the new master", func() bool {
		info, err := writer.Info(ctx, "server").Result()
		if err != nil || !strings.Contains(info, "tcp_port:"+port) {
			return false
		}
		origin.Store(&v2)
		return writer.Set(ctx, cacheKey, v2, time.Hour).Err() == nil
	})
	written := time.Now()
	oldRole := role(node(t, old))

	// 2 goroutines per Client read until v2, then 20 more reads each, all v2.
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(clients))
	for i, c := range clients {
		for g := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				after := -1
				for after < 20 {
					if rctx.Err() != nil {
						errs <- fmt.Errorf("client %d goroutine %d: never read %q within 5s of the write", i, g, v2)
						return
					}
					v, err := c.Get(rctx, "1")
					switch {
					case err != nil: // the failover's errors (READONLY, closed connections) are not what is judged
					case string(v) == v2:
						after++
					case after >= 0:
						errs <- fmt.Errorf("client %d goroutine %d: read %q after %q", i, g, v, v2)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	converged := time.Since(written)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	servedFromMemory(v2)
	t.Logf("SENTINEL FAILOVER %s -> %s; the old master's role when v2 was written: %s; every reader read v2 %v after the write",
		old, promoted, oldRole, converged.Round(time.Millisecond))
}
