package stream

import (
	"context"
	"fmt"
	"slices"
)

// Resyncs: what the stream owes when changes may have been missed (a new slot, a truncate, a large
// transaction, a table that left the publication or was rebuilt), kept until Resync returned nil, and
// recorded outside the process (Config.Owed) so that a crash does not lose them.

// Resync reasons, the values of the "reason" label of keepwarm_stream_resyncs_total.
const (
	// ResyncCreated: no slot existed and none is known to have been streamed from (SlotHistory): a first start.
	ResyncCreated = "created"
	// ResyncLost: no slot exists, but one was streamed from before (SlotHistory): it was dropped, or a standby
	// without it was promoted (PostgreSQL before 17, or a slot that was not synchronized): the changes committed
	// since its last acknowledged LSN were never seen.
	ResyncLost        = "lost"
	ResyncInvalidated = "invalidated" // the slot exists but lost WAL it needs (max_slot_wal_keep_size): recreated
	ResyncTruncate    = "truncate"    // a TRUNCATE of a feeding table: no row to map to ids
	// ResyncPublication: a feeding table had left the publication (a migration rebuilt it: create, copy, drop,
	// rename) and was added back; its changes meanwhile were not streamed.
	ResyncPublication = "publication"
	// ResyncRebuilt: a feeding table is another relation than when the session started (its OID changed), so
	// rows may have changed unseen while it was rebuilt.
	ResyncRebuilt = "rebuilt"
	// ResyncLargeTransaction: a transaction changed more rows than Config.MaxTxnChanges; its changes were
	// dropped as they arrived (bounded memory), and every hot key is refreshed instead.
	ResyncLargeTransaction = "large_transaction"
	// ResyncPublicationGap: the publication was dropped and created again under the slot; pgoutput cannot decode
	// past that point (42704, "publication does not exist"), so the slot was recreated, and changes committed
	// while the publication was gone were never published.
	ResyncPublicationGap = "publication_gap"
	// ResyncReconfigured: the feeds changed (Stream.Reconfigure, a config reload): changes acknowledged under the
	// old ones may matter to the new ones.
	ResyncReconfigured = "reconfigured"
)

// resyncReasons lists every reason, for the metric's label values.
var resyncReasons = []string{ResyncCreated, ResyncLost, ResyncInvalidated, ResyncTruncate, ResyncPublication, ResyncRebuilt,
	ResyncLargeTransaction, ResyncPublicationGap, ResyncReconfigured}

// OwedStore persists the reasons of the resyncs a Stream owes (see Config.Owed). Save replaces the whole
// list (nil or empty: none owed); Load returns what the last Save left. Both may be called from the stream's
// goroutines, one at a time.
type OwedStore interface {
	Load(ctx context.Context) ([]string, error)
	Save(ctx context.Context, reasons []string) error
}

// SlotHistory is implemented by an OwedStore that also remembers that the slot was streamed from
// (warmer.OwedResyncs does), so that a slot found missing is told apart from a first start (ResyncLost rather
// than ResyncCreated): the changes a lost slot did not deliver may be in any cached key, not only hot ones.
type SlotHistory interface {
	Streamed(ctx context.Context) (bool, error)
	MarkStreamed(ctx context.Context) error
}

// slotHistory returns Config.Owed as a SlotHistory, or nil.
func (s *Stream) slotHistory() SlotHistory {
	h, _ := s.cfg.Owed.(SlotHistory)
	return h
}

// loadOwed queues the resyncs a previous process owed (Config.Owed).
func (s *Stream) loadOwed(ctx context.Context) error {
	if s.cfg.Owed == nil {
		return nil
	}
	reasons, err := s.cfg.Owed.Load(ctx)
	if err != nil {
		return fmt.Errorf("read the resyncs owed: %w", err)
	}
	for _, r := range reasons {
		s.log.Warn("a resync owed by an earlier run is still to do", "reason", r)
		s.queueResync(r)
	}
	return nil
}

// saveOwed records the resyncs owed now (Config.Owed).
func (s *Stream) saveOwed(ctx context.Context) error {
	if s.cfg.Owed == nil {
		return nil
	}
	s.mu.Lock()
	reasons := slices.Clone(s.resync)
	s.mu.Unlock()
	if err := s.cfg.Owed.Save(ctx, reasons); err != nil {
		return fmt.Errorf("record the resyncs owed: %w", err)
	}
	return nil
}

func (s *Stream) queueResync(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.Contains(s.resync, reason) {
		s.resync = append(s.resync, reason)
	}
}

// runResyncs calls Resync for each queued reason; a reason stays queued until its Resync returned nil.
func (s *Stream) runResyncs(ctx context.Context) error {
	for {
		s.mu.Lock()
		if len(s.resync) == 0 {
			s.mu.Unlock()
			return nil
		}
		reason := s.resync[0]
		s.mu.Unlock()
		if err := s.saveOwed(ctx); err != nil { // owed (a truncate, a large transaction) before it is done
			return err
		}
		if s.cfg.Resync != nil {
			prev := s.Status().State
			s.setState("resync", nil)
			s.log.Info("resync: refreshing every hot key once", "reason", reason)
			err := s.cfg.Resync(ctx, reason)
			s.setState(prev, nil)
			if err != nil {
				return fmt.Errorf("resync (%s): %w", reason, err)
			}
		}
		s.m.resyncs.WithLabelValues(reason).Inc()
		s.mu.Lock()
		s.st.Resyncs++
		s.resync = slices.DeleteFunc(s.resync, func(r string) bool { return r == reason })
		s.mu.Unlock()
		if err := s.saveOwed(ctx); err != nil {
			// Done, but still recorded as owed: a later run repeats it, which is harmless.
			s.log.Warn("resync done, but its record could not be cleared; a later start repeats it", "reason", reason, "error", err)
		}
	}
}
