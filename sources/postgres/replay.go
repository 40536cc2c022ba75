package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// replayPoll is how often WaitReplay asks a replica how far it has replayed.
const replayPoll = 5 * time.Millisecond

// WaitReplay returns once the server that the source's pool reads from has replayed the WAL up to lsn: at once
// on a primary, and on a read replica (pg_is_in_recovery) when pg_last_wal_replay_lsn() >= lsn, polled every
// 5 ms. It is the read-your-commit step of change-driven refresh: a key refreshed for a commit must not be built
// from a replica that has not seen it. It returns ctx's error when ctx ends first (the caller bounds it), or the
// query's error. The LSN is a bound parameter.
func (s *Source) WaitReplay(ctx context.Context, lsn uint64) error {
	want := pglogrepl.LSN(lsn).String()
	for {
		var done bool
		err := s.pool.QueryRow(ctx, "select not pg_is_in_recovery() or coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)",
			want).Scan(&done)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("keyspace %q: wait for replay of %s: %w", s.cfg.Keyspace, want, err)
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(replayPoll):
		}
	}
}
