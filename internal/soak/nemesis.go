package soak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/benchload"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/warmer"
)

// The nemesis's fault kinds, in the order the usage lists them. Each is one method of soak below.
const (
	faultFlush         = "flushdb"               // FLUSHDB on the Redis the fleet uses
	faultRedisStop     = "redis-sigstop"         // Redis paused (SIGSTOP) for 5–20 s
	faultRedisRestart  = "redis-restart"         // Redis stopped and started again: every key and setting gone
	faultDaemonKill    = "daemon-kill9"          // kill -9 of one daemon, restarted 1–5 s later
	faultDaemonStop    = "daemon-sigstop"        // one daemon paused (SIGSTOP) for 5–20 s
	faultPGRestart     = "pg-restart"            // PostgreSQL restarted (pg_ctl stop -m fast, start)
	faultPGOutage      = "pg-outage"             // PostgreSQL down for 60–150 s, scaled down on short soaks
	faultPoolExhaust   = "pool-exhaustion"       // origin queries hang on a table lock for 5–20 s, holding the pools
	faultRedisLink     = "redis-link"            // 50 ms RTT and connection resets between the daemons and Redis
	faultInvalidate    = "invalidate-inflight"   // an app's Invalidate of a hot key while a daemon refreshes it
	faultSyncStall     = "pg-sync-standby-stall" // the synchronous standby's walreceiver paused 5–20 s: commits wait
	faultPubRecreate   = "publication-recreate"  // DROP PUBLICATION, 3–8 s of updates, CREATE PUBLICATION again
	faultIdentityFlip  = "replica-identity-flip" // track's REPLICA IDENTITY DEFAULT for 10–30 s, then FULL again
	faultRedisOOM      = "redis-oom"             // maxmemory just above used memory, noeviction, for 10–20 s
	faultFailover      = "sentinel-failover"     // --sentinel: kill -9 of the primary, the Sentinels promote the replica
	faultMigration     = "cluster-migration"     // --cluster: hot keys' slots moved to another master key by key
	faultNone          = "none"                  // gaps before the first fault
	attributionInvalid = "invalidation"          // gaps caused by the invalidations themselves (excluded by the SLO)
	attributionUnowned = "not hot for owner"     // gaps on keys no owner had in its hot set (not hot keys by the SLO)
	attributionResync  = "resync invalidation"   // keys deleted around a publication_gap resync (an invalidation, excluded)
)

// excluded reports whether gaps put down to kind are outside the SLO: invalidations, and keys that were hot only
// for replicas that do not own them.
func excluded(kind string) bool {
	return kind == attributionInvalid || kind == attributionUnowned || kind == attributionResync
}

// allFaults lists every fault kind the nemesis implements, in the order of the report's table.
var allFaults = []string{faultFlush, faultRedisStop, faultRedisRestart, faultDaemonKill, faultDaemonStop,
	faultPGRestart, faultPGOutage, faultPoolExhaust, faultRedisLink, faultInvalidate, faultSyncStall, faultPubRecreate,
	faultIdentityFlip, faultRedisOOM, faultFailover, faultMigration}

// faultsFor returns the fault kinds available with a Redis mode: "single" (one server behind the toxiproxy),
// "sentinel" or "cluster". redis-link needs the proxy, which the Sentinels and the Cluster's redirections would
// bypass by handing out the nodes' own addresses.
func faultsFor(mode string) []string {
	var out []string
	for _, k := range allFaults {
		switch {
		case k == faultRedisLink && mode != "single", k == faultFailover && mode != "sentinel",
			k == faultMigration && mode != "cluster":
			continue
		}
		out = append(out, k)
	}
	return out
}

// plannedFault is one fault of the nemesis's schedule.
type plannedFault struct {
	At     time.Duration // since the start of the load
	Kind   string
	Length time.Duration // how long the fault lasts (the downtime of a kill -9); 0 for an instant fault
	Target int           // the daemon a daemon fault hits, 0-based
}

// fullOutage is the PostgreSQL outage's length range on a soak of at least fullSoak; shorter soaks scale it down
// in proportion (never below minOutage), so that a 3-minute soak still has room for other faults.
const (
	fullSoak  = 30 * time.Minute
	minOutage = 10 * time.Second
)

// planFaults draws the nemesis's schedule from seed alone (math/rand/v2's PCG), so that the same seed replays
// the same faults at the same offsets: a fault kind among kinds every 20–40 s (later when the previous fault
// lasts longer), from from until every fault has ended by until. total is the soak's duration, which scales the
// PostgreSQL outage. replicas is the fleet's size.
func planFaults(seed uint64, kinds []string, from, until, total time.Duration, replicas int) []plannedFault {
	r := rand.New(rand.NewPCG(seed, 0x6e656d65736973))
	uniform := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(r.Int64N(int64(hi-lo)+1)) }
	scale := min(1, float64(total)/float64(fullSoak))
	var out []plannedFault
	for at := from; len(kinds) > 0; {
		f := plannedFault{At: at, Kind: kinds[r.IntN(len(kinds))], Target: r.IntN(max(replicas, 1))}
		switch f.Kind {
		case faultRedisStop, faultDaemonStop, faultPoolExhaust, faultRedisLink, faultSyncStall:
			f.Length = uniform(5*time.Second, 20*time.Second)
		case faultPubRecreate:
			f.Length = uniform(3*time.Second, 8*time.Second) // from the DROP to the CREATE
		case faultIdentityFlip:
			f.Length = uniform(10*time.Second, 30*time.Second)
		case faultRedisOOM:
			f.Length = uniform(10*time.Second, 20*time.Second)
		case faultDaemonKill:
			f.Length = uniform(time.Second, 5*time.Second)
		case faultPGOutage:
			f.Length = max(minOutage, time.Duration(float64(uniform(60*time.Second, 150*time.Second))*scale).Round(time.Second))
		case faultInvalidate:
			f.Length = 10 * time.Second // the window in which it looks for refreshes in flight
		}
		if at+f.Length > until {
			break
		}
		out = append(out, f)
		at += max(uniform(20*time.Second, 40*time.Second), f.Length+10*time.Second)
	}
	return out
}

// parseFaults parses --faults: "all" (every kind in available), "none" (a control run) or a comma-separated list
// of kinds.
func parseFaults(s string, available []string) ([]string, error) {
	switch s {
	case "", "all":
		return available, nil
	case "none": // a control run: the same load and checks, no fault
		return nil, nil
	}
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(available, k) {
			return nil, fmt.Errorf("--faults: unknown or unavailable fault %q (available: %s)", k, strings.Join(available, ", "))
		}
		out = append(out, k)
	}
	return out, nil
}

// inject runs one fault to its end (healing it on the way out, also when ctx ends) and returns what it did. The
// new faults also record in r whether they bit (noBite) and when they were in force (outer, inner).
func (s *soak) inject(ctx context.Context, r *faultRecord) (string, error) {
	f := r.plannedFault
	switch f.Kind {
	case faultFlush:
		d, n, err := s.flushDB(ctx)
		if err == nil && n == 0 {
			r.noBite = "Redis held no key to flush"
		}
		r.emptied = err == nil && n > 0
		return d, err
	case faultRedisStop:
		return s.pauseRedis(ctx, f.Length, f.Target)
	case faultRedisRestart:
		d, err := s.restartRedis(ctx, f.Target)
		r.emptied = err == nil && s.cluster == nil && s.sentinel == nil
		return d, err
	case faultDaemonKill:
		return s.killDaemon(ctx, s.daemons[f.Target], f.Length)
	case faultDaemonStop:
		return s.pauseDaemon(ctx, s.daemons[f.Target], f.Length)
	case faultPGRestart:
		return s.restartPostgres(ctx)
	case faultPGOutage:
		return s.postgresOutage(ctx, f.Length)
	case faultPoolExhaust:
		return s.exhaustPool(ctx, f.Length)
	case faultRedisLink:
		return s.degradeRedisLink(ctx, f.Length)
	case faultInvalidate:
		d, n, err := s.invalidateInFlight(ctx, f.Length)
		if err == nil && n == 0 {
			r.noBite = "no hot track's refresh was seen in flight to invalidate"
		}
		return d, err
	case faultSyncStall:
		return s.stallStandby(ctx, r)
	case faultPubRecreate:
		return s.recreatePublication(ctx, r)
	case faultIdentityFlip:
		return s.flipReplicaIdentity(ctx, r)
	case faultRedisOOM:
		return s.redisOOM(ctx, r)
	case faultFailover:
		return s.sentinel.failover(ctx)
	case faultMigration:
		return s.migrateSlots(ctx)
	}
	return "", fmt.Errorf("unknown fault %q", f.Kind)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// flushDB empties the Redis the fleet uses and returns how many keys it held.
func (s *soak) flushDB(ctx context.Context) (string, int64, error) {
	n, _ := s.rdb.DBSize(ctx).Result()
	at := time.Now() // the keys vanish between the send and the reply; the gaps start no later than the reply
	var what string
	var err error
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		what = fmt.Sprintf("%d keys on every master", n)
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.FlushDB(ctx).Err() })
	} else {
		what = fmt.Sprintf("%d keys", n)
		err = s.rdb.FlushDB(ctx).Err()
	}
	if err == nil {
		s.reportEmptied(at)
	}
	return what, n, err
}

// reportEmptied tells the observer that the data set was emptied at once between at and now (see
// observer.emptied): a FLUSHDB, or a restart of the single Redis, which has no persistence.
func (s *soak) reportEmptied(at time.Time) {
	if s.emptied == nil {
		return
	}
	select {
	case s.emptied <- flush{sent: at, done: time.Now()}:
	default:
	}
}

// migrateSlots moves the slots of up to 8 hot keys to another master, key by key, 100 ms apart.
func (s *soak) migrateSlots(ctx context.Context) (string, error) {
	var keys []string
	if h := s.hot.Load(); h != nil {
		for k := range h.keys {
			keys = append(keys, k)
		}
	}
	return s.cluster.migrate(ctx, s.rdb.(*redis.ClusterClient), keys, 8, 100*time.Millisecond)
}

// pauseRedis pauses the Redis server (the primary of a Sentinel group, which may then fail over; master target
// of a Cluster).
func (s *soak) pauseRedis(ctx context.Context, d time.Duration, target int) (string, error) {
	pid := 0
	if s.cluster != nil {
		pid = s.cluster.nodes[target%len(s.cluster.nodes)].pid()
	} else if s.sentinel != nil {
		n, err := s.sentinel.master(ctx)
		if err != nil {
			return "", err
		}
		pid = n.pid()
	} else {
		pid = s.redis.Process.Pid
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return "", err
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	sleep(ctx, d)
	return fmt.Sprintf("pid %d for %v", pid, d.Round(100*time.Millisecond)), nil
}

func (s *soak) restartRedis(ctx context.Context, target int) (string, error) {
	if s.cluster != nil {
		return s.cluster.restart(ctx, s.cluster.nodes[target%len(s.cluster.nodes)])
	}
	if s.sentinel != nil {
		return s.sentinel.restartMaster(ctx)
	}
	t0 := time.Now()
	if err := s.redis.Restart(ctx); err != nil {
		return "", err
	}
	// It comes back empty, like a FLUSHDB: the observer's polls fail while it is down, and the daemons rebuild
	// most hot keys before the observer reads again, so without this it saw about half of the gaps (seed 61:
	// 734 keys gone at each of two restarts, 827 gaps seen, and the phantom check failed on the difference).
	s.reportEmptied(t0)
	return fmt.Sprintf("down %v", time.Since(t0).Round(time.Millisecond)), nil
}

// killDaemon scrapes the daemon's SLO counter, kills it with SIGKILL and starts it again after down. What it
// counted between that last scrape and the kill (a few milliseconds) is lost; the report says so.
func (s *soak) killDaemon(ctx context.Context, d *daemon, down time.Duration) (string, error) {
	s.scrapeOne(d)
	pid, inc, done := d.pid()
	if pid == 0 {
		return "", fmt.Errorf("daemon %s is not running", d.id)
	}
	s.recordPeak(d.id, inc, pid) // /proc/PID is gone once it has been reaped
	s.markDown(d.id)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return "", err
	}
	<-done
	kl := s.readKilledLocks(ctx, d.id)
	s.bookMu.Lock()
	s.killed = append(s.killed, kl)
	s.bookMu.Unlock()
	sleep(ctx, down)
	if err := d.start(); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s (pid %d) down %v", d.id, pid, down.Round(100*time.Millisecond)), d.waitReady(ctx, 30*time.Second)
}

// killedLocks is what the soak read of a killed replica's rebuild locks right after the kill, before any could
// lapse. The daemon's lock tokens name their replica (warmer.LockToken), and each lock must lapse within its
// keyspace's lease (warmer.KeyspaceConfig.Lease), not lock_ttl: the takeover of a dead replica's keys waits for
// them (docs/operations.md, "what a kill -9 still costs by design").
type killedLocks struct {
	at      time.Time
	replica string
	held    int           // its locks found
	longest time.Duration // their longest PTTL
	bound   time.Duration // the largest lease of the keyspaces
	bad     []string      // "key PTTL x" of its locks with no TTL or a PTTL over bound
	err     error
}

// readKilledLocks lists the lock keys (lockKeys) and reads each one's token and PTTL in one pipeline, keeping the
// killed replica's.
func (s *soak) readKilledLocks(ctx context.Context, replica string) killedLocks {
	kl := killedLocks{at: time.Now(), replica: replica}
	for _, ks := range s.cfg.Keyspaces {
		kl.bound = max(kl.bound, s.cfg.WarmerKeyspace(ks, nil).Lease())
	}
	keys := s.lockKeys(ctx)
	if len(keys) == 0 {
		return kl
	}
	gets, pttls := make([]*redis.StringCmd, len(keys)), make([]*redis.DurationCmd, len(keys))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			gets[i], pttls[i] = p.Get(ctx, k), p.PTTL(ctx, k)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		kl.err = err
		return kl
	}
	prefix := warmer.LockTokenPrefix + replica + ":"
	for i, k := range keys {
		if tok, err := gets[i].Result(); err != nil || !strings.HasPrefix(tok, prefix) {
			continue // gone since the scan, or another replica's or an app's
		}
		ttl := pttls[i].Val()
		kl.held++
		kl.longest = max(kl.longest, ttl)
		if ttl < 0 || ttl > kl.bound {
			kl.bad = append(kl.bad, fmt.Sprintf("%s PTTL %v", k, ttl))
		}
	}
	return kl
}

func (s *soak) pauseDaemon(ctx context.Context, d *daemon, length time.Duration) (string, error) {
	s.markDown(d.id)
	if err := d.signal(syscall.SIGSTOP); err != nil {
		return "", err
	}
	defer d.signal(syscall.SIGCONT)
	sleep(ctx, length)
	return fmt.Sprintf("%s for %v", d.id, length.Round(100*time.Millisecond)), nil
}

func (s *soak) restartPostgres(ctx context.Context) (string, error) {
	t0 := time.Now()
	if err := s.pg.stop(ctx, "fast"); err != nil {
		return "", err
	}
	if err := s.pg.start(context.Background()); err != nil {
		return "", err
	}
	return fmt.Sprintf("down %v", time.Since(t0).Round(time.Millisecond)), nil
}

func (s *soak) postgresOutage(ctx context.Context, d time.Duration) (string, error) {
	if err := s.pg.stop(ctx, "fast"); err != nil {
		return "", err
	}
	sleep(ctx, d)
	return fmt.Sprintf("down %v", d), s.pg.start(context.Background())
}

// exhaustPool holds an ACCESS EXCLUSIVE lock on the track table for d: every origin query of the demo's
// keyspaces joins track, so the daemons' fetches hang until their statement_timeout, holding their pool's
// connections, and the fetches queued behind them wait for a connection until pool_wait_timeout (the "hung
// rebuilds hold the pool" fault).
func (s *soak) exhaustPool(ctx context.Context, d time.Duration) (string, error) {
	conn, err := pgx.Connect(ctx, s.pg.dsn("chinook"))
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "set local lock_timeout = '5s'"); err != nil {
		return "", err
	}
	if _, err := tx.Exec(ctx, "lock table track in access exclusive mode"); err != nil {
		return "", fmt.Errorf("lock table track: %w", err)
	}
	sleep(ctx, d)
	return fmt.Sprintf("track locked %v", d.Round(100*time.Millisecond)), nil
}

// degradeRedisLink adds 25 ms of latency each way (50 ms RTT) between the daemons and Redis and, every 2 s,
// resets about 5% of the proxied connections (a reset_peer toxic at toxicity 0.05, removed 200 ms later).
func (s *soak) degradeRedisLink(ctx context.Context, d time.Duration) (string, error) {
	defer s.proxy.heal()
	for _, stream := range []string{"upstream", "downstream"} {
		if err := s.proxy.toxic("latency", stream, 1, map[string]any{"latency": 25}); err != nil {
			return "", err
		}
	}
	end := time.Now().Add(d)
	resets := 0
	for time.Now().Before(end) && ctx.Err() == nil {
		if err := s.proxy.toxic("reset_peer", "downstream", 0.05, map[string]any{"timeout": 0}); err != nil {
			return "", err
		}
		name := fmt.Sprintf("reset_peer_downstream_%d", s.proxy.n)
		resets++
		sleep(ctx, 200*time.Millisecond)
		_ = s.proxy.proxy.Toxics.RemoveToxic(context.Background(), name)
		sleep(ctx, min(1800*time.Millisecond, time.Until(end)))
	}
	return fmt.Sprintf("50 ms RTT for %v, %d reset rounds", d.Round(100*time.Millisecond), resets), nil
}

// invalidateInFlight watches the lock keys of up to 50 hot track keys for window and, each time one is held (a
// rebuild in flight, usually a daemon's refresh), invalidates that id through a lockstep.Client as an app's write
// path would: at most 5 times per fault. Each invalidation is recorded, so that the gap it causes is attributed
// to it (the SLO excludes explicit invalidations) and not to the fault.
func (s *soak) invalidateInFlight(ctx context.Context, window time.Duration) (string, int, error) {
	ks := s.cfg.Keyspace("track")
	keys := ks.Keys()
	c, err := lockstep.New(s.rdb, ks.Name, keys, benchload.LoaderOf(s.srcs[ks.Name]), ks.TTL)
	if err != nil {
		return "", 0, err
	}
	defer c.Close(context.Background())
	var ids []string
	for id := range s.hotIDs("track") {
		ids = append(ids, id)
		if len(ids) == 50 {
			break
		}
	}
	if len(ids) == 0 {
		return "no hot track ids", 0, nil
	}
	locks := make([]string, len(ids))
	for i, id := range ids {
		k, err := keys.For(id)
		if err != nil {
			return "", 0, err
		}
		locks[i] = k.Lock
	}
	var done []string
	end := time.Now().Add(window)
	for time.Now().Before(end) && ctx.Err() == nil && len(done) < 5 {
		cmds := make([]*redis.IntCmd, len(locks))
		pipe := s.rdb.Pipeline()
		for i, l := range locks {
			cmds[i] = pipe.Exists(ctx, l)
		}
		_, _ = pipe.Exec(ctx)
		for i, cmd := range cmds {
			if cmd.Val() == 1 && !slices.Contains(done, ids[i]) {
				k, _ := keys.For(ids[i])
				at := time.Now()
				if err := c.Invalidate(ctx, ids[i]); err == nil {
					s.recordInvalidation(k.Cache, at)
					done = append(done, ids[i])
				}
				break
			}
		}
		sleep(ctx, 5*time.Millisecond)
	}
	return fmt.Sprintf("%d invalidations (track %s)", len(done), strings.Join(done, ",")), len(done), nil
}

// markDown records that the nemesis is about to kill or pause the replica: from then on its last hot set's
// ownership lapses with the takeover (readHot), until it answers again.
func (s *soak) markDown(replica string) {
	s.bookMu.Lock()
	defer s.bookMu.Unlock()
	if s.downAt == nil {
		s.downAt = map[string]time.Time{}
	}
	s.downAt[replica] = time.Now()
}
