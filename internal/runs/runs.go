// Package runs records warmup runs in keepwarm.warmup_runs (see migrations/): one row per `keepwarm warmup`,
// [[schedule]] run or API run, inserted when it starts and completed when it ends.
package runs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keepwarm/keepwarm/warmer"
)

// Heartbeat is how often a running warmup's row gets a new heartbeat_at; StaleAfter is how long a row may go
// without one before SweepStale marks it interrupted (its process died without finishing it).
const (
	Heartbeat  = 15 * time.Second
	StaleAfter = 4 * Heartbeat
)

// Recorder writes warmup runs to PostgreSQL; it implements warmer.RunRecorder. The trigger and status values
// are warmer's (warmer.TriggerX, warmer.RunStatus). While a run goes on, its row's heartbeat_at is renewed every
// Heartbeat (migration 00002), so that a run whose process was killed can be told from one still going.
type Recorder struct {
	pool *pgxpool.Pool
	host string

	mu    sync.Mutex
	beats map[int64]context.CancelFunc // running rows' heartbeat goroutines, each ended by Finish
}

// New returns a Recorder on pool; host names this machine in the rows (os.Hostname when "").
func New(pool *pgxpool.Pool, host string) *Recorder {
	if host == "" {
		host, _ = os.Hostname()
	}
	return &Recorder{pool: pool, host: host, beats: map[int64]context.CancelFunc{}}
}

// Start marks stale rows interrupted (SweepStale), inserts a running row and returns its id, and renews the row's
// heartbeat until Finish. It fails when the migrations have not been applied, with a message saying so.
func (r *Recorder) Start(ctx context.Context, name, trigger, keyspace string) (int64, error) {
	_, _ = r.SweepStale(ctx) // best effort: a failure here must not stop the run
	var id int64
	err := r.pool.QueryRow(ctx, `insert into keepwarm.warmup_runs (name, trigger, keyspace, host)
		values ($1, $2, $3, $4) returning id`, name, trigger, keyspace, r.host).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("record warmup run (did `keepwarm migrate up` run?): %w", err)
	}
	bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.mu.Lock()
	r.beats[id] = cancel
	r.mu.Unlock()
	go func() {
		t := time.NewTicker(Heartbeat)
		defer t.Stop()
		for {
			select {
			case <-bctx.Done():
				return
			case <-t.C:
				// Before migration 00002 there is no column: the error is ignored, and the row cannot be swept.
				_, _ = r.pool.Exec(bctx, `update keepwarm.warmup_runs set heartbeat_at = now() where id = $1 and status = 'running'`, id)
			}
		}
	}()
	return id, nil
}

// SweepStale marks interrupted every running row whose heartbeat is older than StaleAfter (its process died
// without finishing it: kill -9, a lost node) and returns how many. Rows without a heartbeat (written by a binary
// older than migration 00002) are left alone. Errors: the database's (an unmigrated schema among them).
func (r *Recorder) SweepStale(ctx context.Context) (int64, error) {
	tag, err := r.pool.Exec(ctx, `update keepwarm.warmup_runs
		set status = 'interrupted', finished_at = now(),
		    error = 'the process running it stopped without finishing it (killed, or cut off from the database); last heartbeat at ' || heartbeat_at::text
		where status = 'running' and heartbeat_at < now() - make_interval(secs => $1)`, StaleAfter.Seconds())
	if err != nil {
		return 0, fmt.Errorf("sweep stale warmup runs: %w", err)
	}
	return tag.RowsAffected(), nil
}

// stopBeat ends row id's heartbeat goroutine.
func (r *Recorder) stopBeat(id int64) {
	r.mu.Lock()
	cancel := r.beats[id]
	delete(r.beats, id)
	r.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// Finish completes row id with res's counts and status. It uses its own deadline, so that an interrupted run is
// still recorded as such.
func (r *Recorder) Finish(ctx context.Context, id int64, res warmer.WarmupResult, runErr error) error {
	r.stopBeat(id)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var errText *string
	if cause := errors.Join(runErr, res.FirstError); cause != nil {
		s := cause.Error()
		errText = &s
	}
	_, err := r.pool.Exec(ctx, `update keepwarm.warmup_runs
		set finished_at = now(), status = $2, requested = $3, written = $4, skipped_locked = $5, missing = $6,
		    failed = $7, error = $8
		where id = $1`, id, warmer.RunStatus(res, runErr), res.Requested, res.Written, res.SkippedLocked, res.Missing,
		res.Failed, errText)
	if err != nil {
		return fmt.Errorf("record end of warmup run %d: %w", id, err)
	}
	return nil
}
