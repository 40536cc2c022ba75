package soak

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/keepwarm/keepwarm/internal/benchload"
	"github.com/redis/go-redis/v9"
)

// The faults aimed at the change-driven refresh and its freshness SLO (pg-sync-standby-stall,
// publication-recreate, replica-identity-flip) and at Redis's memory (redis-oom). Each records in its faultRecord
// whether it bit, measured from outside the daemons where it can be (PostgreSQL's and Redis's own views); where
// only a daemon counter shows the effect (a resync, an UPDATE without its old row), the counter is named.

// stallStandby pauses the synchronous standby's walreceiver (SIGSTOP) for r.Length: the primary waits for its
// confirmation before any commit returns or becomes visible. It bites when pg_stat_activity on the primary shows
// a backend waiting for it (wait_event SyncRep), sampled every 250 ms.
func (s *soak) stallStandby(ctx context.Context, r *faultRecord) (string, error) {
	if s.pg.standby == nil {
		return "", errors.New("no synchronous standby (setup adds one when the plan has this fault)")
	}
	pid, err := walReceiverPID(ctx, s.pg.standby.DSN("postgres"))
	if err != nil {
		return "", err
	}
	mon, err := pgx.Connect(ctx, s.pg.dsn("chinook"))
	if err != nil {
		return "", err
	}
	defer mon.Close(context.Background())
	s.pg.stalled.Store(int64(pid))
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return "", fmt.Errorf("SIGSTOP the walreceiver (pid %d): %w", pid, err)
	}
	defer func() {
		_ = syscall.Kill(pid, syscall.SIGCONT)
		s.pg.stalled.Store(0)
	}()
	r.outer[0] = time.Now()
	r.inner[0] = r.outer[0]
	end := r.outer[0].Add(r.Length)
	waiting, looks := 0, 0
	for time.Now().Before(end) && ctx.Err() == nil {
		var n int
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		if err := mon.QueryRow(qctx, "select count(*) from pg_stat_activity where wait_event = 'SyncRep'").Scan(&n); err == nil {
			waiting, looks = max(waiting, n), looks+1
		}
		cancel()
		sleep(ctx, min(250*time.Millisecond, time.Until(end)))
	}
	r.inner[1] = time.Now() // the stall certainly held until here; a commit can return as soon as SIGCONT is sent
	_ = syscall.Kill(pid, syscall.SIGCONT)
	r.outer[1] = time.Now()
	s.scrapeAll()
	vt := sumOf(s.counterTotals().sub(r.totalsAt).of("visibility_timeouts"))
	if waiting == 0 {
		r.noBite = fmt.Sprintf("no commit waited for the standby (%d looks at pg_stat_activity, none with wait_event SyncRep)", looks)
	}
	return fmt.Sprintf("walreceiver pid %d stopped %v: up to %d commits waiting; daemons' visibility timeouts +%.0f",
		pid, r.outer[1].Sub(r.outer[0]).Round(100*time.Millisecond), waiting, vt), nil
}

// walReceiverPID returns the pid of the standby's walreceiver.
func walReceiverPID(ctx context.Context, dsn string) (int, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, fmt.Errorf("connect to the standby: %w", err)
	}
	defer conn.Close(context.Background())
	var pid int
	if err := conn.QueryRow(ctx, "select pid from pg_stat_wal_receiver").Scan(&pid); err != nil {
		return 0, fmt.Errorf("the standby's walreceiver (pg_stat_wal_receiver): %w", err)
	}
	return pid, nil
}

// fedTables returns the feeding tables of the config's keyspaces, sorted ("public.track", ...).
func (s *soak) fedTables() []string {
	var out []string
	for _, ks := range s.cfg.Keyspaces {
		for _, f := range ks.FedBy {
			if !slices.Contains(out, f.Table) {
				out = append(out, f.Table)
			}
		}
	}
	slices.Sort(out)
	return out
}

// recreatePublication drops the daemons' publication, lets the updater commit for r.Length, and creates it again
// for the feeding tables, as an operator or a migration tool might. A daemon with create_publication may create
// it first (at its reconnect after the stream failed); the nemesis's CREATE then finds it (42710). Either way the
// slot cannot decode past the gap (42704) and must be recreated, with a publication_gap resync. It bites when the
// daemons' keepwarm_stream_resyncs_total{reason="publication_gap"} grows within 60 s of the CREATE.
func (s *soak) recreatePublication(ctx context.Context, r *faultRecord) (string, error) {
	pub := pgx.Identifier{s.cfg.Changes.Publication}.Sanitize()
	var tables []string
	for _, t := range s.fedTables() {
		tables = append(tables, pgx.Identifier(strings.Split(t, ".")).Sanitize())
	}
	conn, err := pgx.Connect(ctx, s.pg.dsn("chinook"))
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	r.outer[0] = time.Now()
	if _, err := conn.Exec(ctx, "drop publication "+pub); err != nil {
		return "", fmt.Errorf("drop publication: %w", err)
	}
	dropped := time.Now()
	// A change of a fed table committed inside the gap, whatever the updater manages meanwhile (it may be stalled
	// by an earlier fault): the stream must decode it, against a publication that does not exist at its LSN.
	sleep(ctx, r.Length/2)
	if _, err := conn.Exec(ctx, "update track set name = name where track_id = (select min(track_id) from track)"); err != nil {
		return "", fmt.Errorf("update inside the gap: %w", err)
	}
	sleep(ctx, r.Length-r.Length/2)
	by := "the nemesis"
	_, err = conn.Exec(context.WithoutCancel(ctx), fmt.Sprintf("create publication %s for table %s with (publish_via_partition_root = true)",
		pub, strings.Join(tables, ", ")))
	if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "42710" {
		by, err = "a daemon (create_publication) before the nemesis", nil
	}
	if err != nil {
		return "", fmt.Errorf("create publication: %w", err)
	}
	back := time.Now()
	deadline := back.Add(60 * time.Second)
	for {
		s.scrapeAll()
		if s.counterTotals()["resyncs/publication_gap"] > r.totalsAt["resyncs/publication_gap"] {
			r.outer[1] = time.Now()
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			// The stream may be in a reconnect back-off from an earlier fault: whether the resync came at all is
			// judged again at the end of the run (biteLate).
			r.outer[1] = time.Now()
			r.noBite = "no publication_gap resync counted by the end of the run"
			r.biteLate = true
			break
		}
		sleep(ctx, 500*time.Millisecond)
	}
	r.inner = r.outer
	return fmt.Sprintf("dropped %v, re-created by %s; publication_gap resync seen %v after the drop",
		back.Sub(dropped).Round(100*time.Millisecond), by, r.outer[1].Sub(dropped).Round(100*time.Millisecond)), nil
}

// alterTrack runs an ALTER TABLE on track with a 5 s lock_timeout, retried while the lock is not granted (a
// daemon's fetch, or an app's, holds it) until ctx ends.
func alterTrack(ctx context.Context, conn *pgx.Conn, sql string) error {
	for {
		_, err := conn.Exec(ctx, "set lock_timeout = '5s'")
		if err == nil {
			_, err = conn.Exec(ctx, sql)
		}
		if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "55P03" && ctx.Err() == nil {
			continue
		}
		return err
	}
}

// flipReplicaIdentity sets REPLICA IDENTITY DEFAULT on track for r.Length, then FULL again. Meanwhile an UPDATE
// sends no old row, so a move of a track to another album leaves the old album's key stale (the daemon counts
// such UPDATEs in keepwarm_stream_old_ids_unknown_total); the updater is asked for a move at the start, so that
// at least one happens. It bites when a move committed while the identity was DEFAULT and the daemons' counter
// grew.
func (s *soak) flipReplicaIdentity(ctx context.Context, r *faultRecord) (string, error) {
	conn, err := pgx.Connect(ctx, s.pg.dsn("chinook"))
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	r.outer[0] = time.Now()
	if err := alterTrack(ctx, conn, "alter table track replica identity default"); err != nil {
		return "", fmt.Errorf("replica identity default: %w", err)
	}
	r.inner[0] = time.Now()
	s.fresh.wantMove()
	sleep(ctx, r.Length/2)
	if s.fresh.track.movesBetween(r.inner[0], time.Now()) == 0 {
		s.fresh.wantMove() // the first request may have gone to an update that failed
	}
	sleep(ctx, r.Length-r.Length/2)
	r.inner[1] = time.Now()
	// FULL again whatever happened: the rest of the soak needs it (on a fresh context, bounded).
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	err = alterTrack(fctx, conn, "alter table track replica identity full")
	cancel()
	r.outer[1] = time.Now()
	if err != nil {
		return "", fmt.Errorf("replica identity full again: %w", err)
	}
	sleep(ctx, 2*time.Second) // the stream's last UPDATEs of the window
	s.scrapeAll()
	unknown := s.counterTotals()["old_ids_unknown/"] - r.totalsAt["old_ids_unknown/"]
	moves := s.fresh.track.movesBetween(r.inner[0], r.inner[1])
	updates := s.fresh.track.updatesWithin(r.inner[0], r.inner[1])
	switch {
	case moves == 0:
		r.noBite = "no move committed while the replica identity was DEFAULT"
	case unknown == 0:
		r.noBite = "keepwarm_stream_old_ids_unknown_total did not grow"
	}
	return fmt.Sprintf("DEFAULT for %v: %d updates (%d moves) committed; daemons' old_ids_unknown +%.0f",
		r.inner[1].Sub(r.inner[0]).Round(100*time.Millisecond), updates, moves, unknown), nil
}

// masters returns a client of every Redis master: the single server, the Sentinel group's primary, or each
// master of the Cluster.
func (s *soak) masters(ctx context.Context) ([]redis.UniversalClient, error) {
	cc, ok := s.rdb.(*redis.ClusterClient)
	if !ok {
		return []redis.UniversalClient{s.rdb}, nil
	}
	var mu sync.Mutex // ForEachMaster calls in parallel
	var out []redis.UniversalClient
	err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		out = append(out, c)
		mu.Unlock()
		return nil
	})
	return out, err
}

// redisInfo returns one field of an INFO section of c ("" when absent or on error).
func redisInfo(ctx context.Context, c redis.UniversalClient, section, field string) string {
	info, err := c.Info(ctx, section).Result()
	if err != nil {
		return ""
	}
	return benchload.InfoField(info, field)
}

// oomRefusals reads how many commands Redis refused for memory (INFO errorstats, errorstat_OOM:count=N).
func oomRefusals(ctx context.Context, c redis.UniversalClient) int64 {
	v := redisInfo(ctx, c, "errorstats", "errorstat_OOM")
	n, _ := strconv.ParseInt(strings.TrimPrefix(v, "count="), 10, 64)
	return n
}

// redisOOM sets maxmemory just above the memory each master uses (64 KiB above), with maxmemory-policy
// noeviction, for r.Length, then restores both: writes that need memory are refused (OOM) while reads go on.
// Every 500 ms the limit follows the used memory down (never up), so that keys expiring meanwhile do not make
// room (a fixed limit drew 9,275 refusals in one fault and 3 in the next). It bites when Redis refused some
// command for memory (INFO errorstats).
func (s *soak) redisOOM(ctx context.Context, r *faultRecord) (string, error) {
	ms, err := s.masters(ctx)
	if err != nil {
		return "", err
	}
	type saved struct {
		c              redis.UniversalClient
		limit, policy  string
		used, refusals int64
		set            int64 // the maxmemory in force
	}
	var sv []saved
	restore := func() {
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, m := range sv {
			_ = m.c.ConfigSet(rctx, "maxmemory", m.limit).Err()
			_ = m.c.ConfigSet(rctx, "maxmemory-policy", m.policy).Err()
		}
	}
	defer restore()
	for _, c := range ms {
		cfg, err := c.ConfigGet(ctx, "maxmemory*").Result()
		if err != nil {
			return "", fmt.Errorf("CONFIG GET maxmemory: %w", err)
		}
		used, err := strconv.ParseInt(redisInfo(ctx, c, "memory", "used_memory"), 10, 64)
		if err != nil {
			return "", fmt.Errorf("INFO memory used_memory: %w", err)
		}
		m := saved{c: c, limit: cfg["maxmemory"], policy: cfg["maxmemory-policy"], used: used, refusals: oomRefusals(ctx, c),
			set: used + 64<<10}
		sv = append(sv, m)
		if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
			return "", err
		}
		if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(m.set, 10)).Err(); err != nil {
			return "", err
		}
	}
	r.outer[0] = time.Now()
	r.inner[0] = r.outer[0]
	end := r.outer[0].Add(r.Length)
	lowest := int64(0)
	for time.Now().Before(end) && ctx.Err() == nil {
		sleep(ctx, min(500*time.Millisecond, time.Until(end)))
		lowest = 0
		for i := range sv {
			m := &sv[i]
			if used, err := strconv.ParseInt(redisInfo(ctx, m.c, "memory", "used_memory"), 10, 64); err == nil && used+64<<10 < m.set {
				if m.c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used+64<<10, 10)).Err() == nil {
					m.set = used + 64<<10
				}
			}
			lowest += m.set
		}
	}
	restore()
	r.outer[1] = time.Now()
	r.inner[1] = r.outer[1]
	var refused, used int64
	for _, m := range sv {
		refused += oomRefusals(context.WithoutCancel(ctx), m.c) - m.refusals
		used += m.used
	}
	if refused <= 0 {
		r.noBite = "Redis refused no command for memory (INFO errorstats errorstat_OOM)"
	}
	return fmt.Sprintf("maxmemory %.1f MiB (used + 64 KiB), down to %.1f MiB, noeviction, for %v: %d commands refused (OOM)",
		float64(used+int64(len(sv))*64<<10)/(1<<20), float64(lowest)/(1<<20), r.outer[1].Sub(r.outer[0]).Round(100*time.Millisecond), refused), nil
}

func sumOf(m map[string]float64) float64 {
	t := 0.0
	for _, v := range m {
		t += v
	}
	return t
}
