package postgres

import (
	"context"
	"errors"
	"fmt"
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

// ensureSlot creates the slot when it does not exist, and recreates it when PostgreSQL invalidated it; both
// queue a resync. A slot held by another process (a daemon that lost its lease but not yet its connection, or
// a dead host's connection not yet timed out) is taken over by terminating that backend: the caller holds the
// fleet's stream lease, so the other process must not stream any more.
func (s *Stream) ensureSlot(ctx context.Context, conn *pgconn.PgConn) error {
	for try := 0; ; try++ {
		res, err := conn.Exec(ctx, "select coalesce(wal_status, ''), coalesce(active_pid, 0)::text, plugin, "+
			"coalesce(confirmed_flush_lsn::text, '') from pg_replication_slots where slot_name = "+quoteLiteral(s.cfg.Slot)).ReadAll()
		if err != nil {
			return fmt.Errorf("read slot: %w", err)
		}
		if len(res[0].Rows) == 0 {
			return s.createSlot(ctx, conn, ResyncCreated)
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
			return s.createSlot(ctx, conn, ResyncInvalidated)
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
		if lsn, err := pglogrepl.ParseLSN(string(row[3])); err == nil {
			s.mu.Lock()
			s.acked = max(s.acked, lsn)
			s.mu.Unlock()
		}
		return nil
	}
}

func (s *Stream) createSlot(ctx context.Context, conn *pgconn.PgConn, reason string) error {
	// The resync is owed from the moment the slot exists: recorded first, so that no crash can come between.
	s.queueResync(reason)
	if err := s.saveOwed(ctx); err != nil {
		return err
	}
	r, err := pglogrepl.CreateReplicationSlot(ctx, conn, s.cfg.Slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT"})
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
