// Package runs records warmup runs in keepwarm.warmup_runs (see migrations/): one row per `keepwarm warmup`,
// [[schedule]] run or API run, inserted when it starts and completed when it ends.
package runs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keepwarm/keepwarm/warmer"
)

// Recorder writes warmup runs to PostgreSQL; it implements warmer.RunRecorder. The trigger and status values
// are warmer's (warmer.TriggerX, warmer.RunStatus).
type Recorder struct {
	pool *pgxpool.Pool
	host string
}

// New returns a Recorder on pool; host names this machine in the rows (os.Hostname when "").
func New(pool *pgxpool.Pool, host string) *Recorder {
	if host == "" {
		host, _ = os.Hostname()
	}
	return &Recorder{pool: pool, host: host}
}

// Start inserts a running row and returns its id. It fails when the migrations have not been applied, with a
// message saying so.
func (r *Recorder) Start(ctx context.Context, name, trigger, keyspace string) (int64, error) {
	var id int64
	err := r.pool.QueryRow(ctx, `insert into keepwarm.warmup_runs (name, trigger, keyspace, host)
		values ($1, $2, $3, $4) returning id`, name, trigger, keyspace, r.host).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("record warmup run (did `keepwarm migrate up` run?): %w", err)
	}
	return id, nil
}

// Finish completes row id with res's counts and status. It uses its own deadline, so that an interrupted run is
// still recorded as such.
func (r *Recorder) Finish(ctx context.Context, id int64, res warmer.WarmupResult, runErr error) error {
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
