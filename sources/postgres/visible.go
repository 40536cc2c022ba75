package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// How often WaitVisible looks again while a commit is not visible: every visiblePollMin at first, doubling up to
// visiblePollMax, so that a commit held for seconds (a synchronous standby that stalls) costs a query every
// 100 ms rather than every 5 ms, and one released is seen within 100 ms.
const (
	visiblePollMin = 5 * time.Millisecond
	visiblePollMax = 100 * time.Millisecond
)

// visibleSQL answers, in one round trip, whether the server is a standby, how far it has replayed, and which of
// the transaction ids $1 (32-bit xids as int8) are not visible to a new snapshot. A 32-bit xid is widened to the
// 64-bit xid (xid8) nearest the snapshot's xmax: the one of xmax's epoch, or of the epoch before or after when
// that is within 2^31 (PostgreSQL keeps every live xid within 2^31 of every other, its wraparound rule, and
// FullTransactionIdFromAllowableAt widens the same way). The widened xid may be at or past xmax: xmax is the
// latest completed xid + 1, so a transaction still in the procarray, the newest one say, can be there, and is not
// visible. pg_visible_in_snapshot and pg_current_snapshot exist from PostgreSQL 13.
const visibleSQL = `select pg_is_in_recovery(), coalesce(pg_last_wal_replay_lsn()::text, ''),
	coalesce((select array_agg(x) from unnest($1::int8[]) as x
		where not pg_visible_in_snapshot((case
			when e.base + x > e.xmax + 2147483648 and e.base > 0 then e.base + x - 4294967296
			when e.base + x < e.xmax - 2147483648 then e.base + x + 4294967296
			else e.base + x end)::text::xid8, e.snap)), '{}')
	from (select snap, pg_snapshot_xmax(snap)::text::int8 as xmax, (pg_snapshot_xmax(snap)::text::int8 >> 32) << 32 as base
		from (select pg_current_snapshot() as snap) s) e`

// WaitVisible returns once every transaction of xids is visible to a new snapshot on the server that the
// source's pool reads from, so that a query run after it reads their rows. xids[i] is a committed transaction's
// 32-bit id (Txn.Xid) and ends[i] the LSN just past its commit record (Txn.End); the slices have the same
// length.
//
// On a primary a transaction is visible once its backend has left the procarray: a commit is decoded and
// streamed as soon as its WAL is flushed, while its backend may still wait for a synchronous standby (Patroni and
// most HA set-ups) or, for a moment, for the CPU; its row is not visible meanwhile, and a refresh then would
// write the old row and acknowledge the change. pg_xact_status says "committed" in that window (the commit log
// is written before the wait), so visibility is asked with pg_visible_in_snapshot(xid, pg_current_snapshot()).
// On a read replica (pg_is_in_recovery) a transaction is visible once the replica has replayed its commit
// record: pg_last_wal_replay_lsn() >= its end LSN.
//
// It polls every 5 ms, doubling up to 100 ms. It returns, for each transaction, the last time it was seen not
// visible (the zero time when it was visible at the first look): the moment it became visible is later, which
// makes it a lower bound for freshness accounting. It returns ctx's error when ctx ends first (the caller bounds
// the wait), or the query's error. Every value is a bound parameter.
func (s *Source) WaitVisible(ctx context.Context, xids []uint32, ends []uint64) ([]time.Time, error) {
	if len(xids) != len(ends) {
		return nil, fmt.Errorf("keyspace %q: wait for visibility: %d xids and %d LSNs", s.cfg.Keyspace, len(xids), len(ends))
	}
	lastSeen := make([]time.Time, len(xids))
	pending := make([]int, len(xids)) // indexes of the transactions not yet seen visible
	for i := range pending {
		pending[i] = i
	}
	wait := visiblePollMin
	for len(pending) > 0 {
		ask := make([]int64, len(pending))
		for j, i := range pending {
			ask[j] = int64(xids[i])
		}
		var standby bool
		var replayed string
		var invisible []int64
		asked := time.Now()
		err := s.pool.QueryRow(ctx, visibleSQL, ask).Scan(&standby, &replayed, &invisible)
		if err != nil {
			if ctx.Err() != nil {
				return lastSeen, ctx.Err()
			}
			return lastSeen, fmt.Errorf("keyspace %q: wait for commits to be visible: %w", s.cfg.Keyspace, err)
		}
		notYet := make(map[int64]bool, len(invisible))
		for _, x := range invisible {
			notYet[x] = true
		}
		var replayedTo pglogrepl.LSN
		if standby {
			if replayedTo, err = pglogrepl.ParseLSN(replayed); err != nil {
				replayedTo = 0 // no replay yet: nothing is visible
			}
		}
		next := pending[:0]
		for _, i := range pending {
			visible := !notYet[int64(xids[i])]
			if standby {
				visible = replayedTo >= pglogrepl.LSN(ends[i])
			}
			if !visible {
				lastSeen[i] = asked
				next = append(next, i)
			}
		}
		pending = next
		if len(pending) == 0 {
			return lastSeen, nil
		}
		select {
		case <-ctx.Done():
			return lastSeen, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, visiblePollMax)
	}
	return lastSeen, nil
}
