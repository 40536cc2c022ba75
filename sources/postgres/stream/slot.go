package stream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// The replication slot: the permanent logical slot (plugin pgoutput) that keeps the WAL keepwarm has not
// acknowledged, and from whose confirmed LSN a new session resumes.

// ErrSlotActive is returned (wrapped) when another process streams from the slot and could not be stopped.
var ErrSlotActive = errors.New("postgres: replication slot is active in another process")

func slotPluginError(slot, plugin string) error {
	return fmt.Errorf("postgres: slot %q uses plugin %q, not pgoutput: it is not keepwarm's; choose another [changes] slot", slot, plugin)
}

// ensureSlot creates the slot when it does not exist, and recreates it when PostgreSQL invalidated it or when
// pgoutput cannot decode past a publication dropped and created again (Stream.recreate); each queues a resync. A
// slot held by another process (a daemon that lost its lease but not yet its connection, or a dead host's
// connection not yet timed out) is taken over by terminating that backend: the caller holds the fleet's stream
// lease, so the other process must not stream any more. On PostgreSQL 17 and later the slot is a failover slot
// (FAILOVER true, set on an existing slot too), which standbys with sync_replication_slots keep in step, so
// that it survives a promotion.
func (s *Stream) ensureSlot(ctx context.Context, conn *pgconn.PgConn) error {
	rows, err := query(ctx, conn, "select current_setting('server_version_num')")
	if err != nil {
		return fmt.Errorf("read server version: %w", err)
	}
	version, _ := strconv.Atoi(rows[0][0])
	failover := "'false'"
	if version >= 170000 {
		failover = "failover::text"
	}
	for try := 0; ; try++ {
		res, err := conn.Exec(ctx, "select coalesce(wal_status, ''), coalesce(active_pid, 0)::text, plugin, "+
			"coalesce(confirmed_flush_lsn::text, ''), "+failover+" from pg_replication_slots where slot_name = "+quoteLiteral(s.cfg.Slot)).ReadAll()
		if err != nil {
			return fmt.Errorf("read slot: %w", err)
		}
		if len(res[0].Rows) == 0 {
			reason := ResyncCreated
			if h := s.slotHistory(); h != nil {
				streamed, err := h.Streamed(ctx)
				if err != nil {
					return fmt.Errorf("read whether the slot was streamed from before: %w", err)
				}
				if streamed {
					reason = ResyncLost
					s.log.Error("the replication slot streamed from before is gone (dropped, or a standby promoted without it): creating it and resyncing; changes since its last acknowledged LSN were not seen")
				}
			}
			return s.createSlot(ctx, conn, reason, version)
		}
		row := res[0].Rows[0]
		walStatus, pid, plugin := string(row[0]), string(row[1]), string(row[2])
		if plugin != "pgoutput" {
			return &fatalError{slotPluginError(s.cfg.Slot, plugin)}
		}
		if walStatus == "lost" {
			s.log.Error("replication slot invalidated (max_slot_wal_keep_size): recreating it and refreshing every hot key once", "wal_status", walStatus)
			if _, err := conn.Exec(ctx, "select pg_drop_replication_slot("+quoteLiteral(s.cfg.Slot)+")").ReadAll(); err != nil {
				return fmt.Errorf("drop invalidated slot: %w", err)
			}
			return s.createSlot(ctx, conn, ResyncInvalidated, version)
		}
		if pid != "0" {
			if try >= 20 {
				return fmt.Errorf("%w (pid %s)", ErrSlotActive, pid)
			}
			if try == 0 {
				s.log.Warn("replication slot held by another backend; terminating it (this daemon holds the stream lease)", "pid", pid)
				if _, err := conn.Exec(ctx, "select pg_terminate_backend("+pid+")").ReadAll(); err != nil {
					return fmt.Errorf("%w (pid %s): %w", ErrSlotActive, pid, err)
				}
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		s.mu.Lock()
		recreate := s.recreate
		s.mu.Unlock()
		if recreate {
			if _, err := conn.Exec(ctx, "select pg_drop_replication_slot("+quoteLiteral(s.cfg.Slot)+")").ReadAll(); err != nil {
				return fmt.Errorf("drop the slot to recreate it: %w", err)
			}
			if err := s.createSlot(ctx, conn, ResyncPublicationGap, version); err != nil {
				return err
			}
			s.mu.Lock()
			s.recreate = false
			s.mu.Unlock()
			return nil
		}
		if version >= 170000 && string(row[4]) != "true" {
			// A slot created before 17, or by an older keepwarm: make it a failover slot (it is not active now).
			if _, err := conn.Exec(ctx, "ALTER_REPLICATION_SLOT "+s.cfg.Slot+" (FAILOVER true)").ReadAll(); err != nil {
				s.log.Warn("cannot make the replication slot a failover slot; it will not survive a promotion", "error", err)
			} else {
				s.log.Info("replication slot is now a failover slot (standbys with sync_replication_slots keep it)")
			}
		}
		if lsn, err := pglogrepl.ParseLSN(string(row[3])); err == nil {
			s.mu.Lock()
			s.acked = max(s.acked, lsn)
			s.mu.Unlock()
		}
		return nil
	}
}

// createSlot creates the slot (a failover slot from PostgreSQL 17, version being server_version_num) and queues
// a resync for reason.
func (s *Stream) createSlot(ctx context.Context, conn *pgconn.PgConn, reason string, version int) error {
	// The resync is owed from the moment the slot exists: recorded first, so that no crash can come between.
	s.queueResync(reason)
	if err := s.saveOwed(ctx); err != nil {
		return err
	}
	var r pglogrepl.CreateReplicationSlotResult
	var err error
	if version >= 170000 {
		r, err = pglogrepl.ParseCreateReplicationSlot(conn.Exec(ctx, createFailoverSlotSQL(s.cfg.Slot)))
	} else {
		r, err = pglogrepl.CreateReplicationSlot(ctx, conn, s.cfg.Slot, "pgoutput",
			pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT"})
	}
	if err != nil {
		return fmt.Errorf("create slot: %w", err)
	}
	if lsn, err := pglogrepl.ParseLSN(r.ConsistentPoint); err == nil {
		s.mu.Lock()
		s.acked = lsn
		s.mu.Unlock()
	}
	s.log.Warn("replication slot created; changes committed before it are not streamed: refreshing every hot key once",
		"reason", reason, "consistent_point", r.ConsistentPoint)
	return nil
}

// createFailoverSlotSQL is the replication command that creates a logical failover slot (PostgreSQL 17+): the
// standbys that synchronize slots (sync_replication_slots = on) keep a copy, so that a promoted standby has it at
// a confirmed LSN and the stream resumes without a resync.
func createFailoverSlotSQL(slot string) string {
	return "CREATE_REPLICATION_SLOT " + slot + " LOGICAL pgoutput (SNAPSHOT 'nothing', FAILOVER true)"
}
