package warmer

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/keepwarm/keepwarm/internal/backoff"
)

// Checker is implemented by a Source that can verify its queries against the origin without running them (the
// table and columns exist, the shapes are right), as sources/postgres does. When a keyspace's Source is a
// Checker, the Warmer checks it before the keyspace's first refresh and, while the check fails (a table renamed
// during a migration, the origin down), retries it with jittered exponential back-off (CheckBackoffBase doubling
// up to CheckBackoffMax) and refreshes nothing in that keyspace; the other keyspaces run meanwhile. Failing
// reports the keyspaces still failing. Check must honour ctx.
type Checker interface {
	Check(ctx context.Context) error
}

// Bounds of the start-up check of a keyspace's source (see Checker).
const (
	// CheckTimeout bounds one check attempt.
	CheckTimeout = 5 * time.Second
	// CheckBackoffBase is the first pause after a failed check (before jitter); it doubles per failure.
	CheckBackoffBase = time.Second
	// CheckBackoffMax is the longest pause between two checks of a failing keyspace.
	CheckBackoffMax = time.Minute
)

// CheckFailure is a keyspace whose source check fails, as Failing reports it.
type CheckFailure struct {
	Keyspace  string    `json:"keyspace"`
	Error     string    `json:"error"`
	Since     time.Time `json:"since"`      // first failure
	Attempts  int       `json:"attempts"`   // failed checks so far
	NextCheck time.Time `json:"next_check"` // when the check runs again
}

// checks tracks the keyspaces whose source check has not passed yet.
type checks struct {
	mu      sync.Mutex
	failing map[*keyspace]CheckFailure
}

// Failing returns the keyspaces whose source check fails, sorted by name; empty when every keyspace runs.
func (w *Warmer) Failing() []CheckFailure {
	w.checks.mu.Lock()
	defer w.checks.mu.Unlock()
	out := make([]CheckFailure, 0, len(w.checks.failing))
	for _, f := range w.checks.failing {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Keyspace < out[j].Keyspace })
	return out
}

func (w *Warmer) checkFailure(k *keyspace) (CheckFailure, bool) {
	w.checks.mu.Lock()
	defer w.checks.mu.Unlock()
	f, ok := w.checks.failing[k]
	return f, ok
}

// startKeyspace starts k's scheduler loop, after its source check passes when the source is a Checker. The
// check loop is part of k's lifetime: stopping k (a reload removed it) or ending ctx stops it.
func (w *Warmer) startKeyspace(ctx, workCtx context.Context, wg *sync.WaitGroup, k *keyspace) {
	if _, ok := k.config().Src.(Checker); !ok {
		k.start(ctx, workCtx, wg)
		return
	}
	cctx, cancel := context.WithCancel(ctx)
	k.cancelMu.Lock()
	k.cancel = cancel // k.stop cancels the check loop; k.start later replaces it with a child of cctx
	k.cancelMu.Unlock()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if w.checkUntilOK(cctx, k) {
			k.start(cctx, workCtx, wg)
		}
	}()
}

// checkUntilOK checks k's source until the check passes (true) or ctx ends (false), pausing backoff.Delay
// between attempts. Each attempt checks the source of k's current config, so a reload that fixes the query is picked up.
// Each failure is logged (the first at Error, then every tenth) and reported by Failing until the check passes.
func (w *Warmer) checkUntilOK(ctx context.Context, k *keyspace) bool {
	defer func() {
		w.checks.mu.Lock()
		delete(w.checks.failing, k)
		w.checks.mu.Unlock()
	}()
	rnd := w.newRand()
	var since time.Time
	for attempt := 0; ; attempt++ {
		chk, ok := k.config().Src.(Checker)
		if !ok {
			return true // a reload swapped in a source without a check
		}
		actx, cancel := context.WithTimeout(ctx, CheckTimeout)
		err := chk.Check(actx)
		cancel()
		if ctx.Err() != nil {
			return false
		}
		if err == nil {
			if attempt > 0 {
				k.log.Info("keyspace check passed; refreshes start", "failed_checks", attempt)
			}
			return true
		}
		if errors.Is(err, context.DeadlineExceeded) {
			err = errors.Join(errors.New("check timed out after "+CheckTimeout.String()), err)
		}
		now := w.now()
		if since.IsZero() {
			since = now
		}
		pause := backoff.Delay(attempt, CheckBackoffBase, CheckBackoffMax, rnd.Float64())
		w.checks.mu.Lock()
		if w.checks.failing == nil {
			w.checks.failing = map[*keyspace]CheckFailure{}
		}
		w.checks.failing[k] = CheckFailure{Keyspace: k.name, Error: err.Error(), Since: since, Attempts: attempt + 1,
			NextCheck: now.Add(pause)}
		w.checks.mu.Unlock()
		if attempt == 0 || (attempt+1)%10 == 0 {
			k.log.Error("keyspace check failed; its keys are not refreshed until it passes, other keyspaces run",
				"error", err, "attempt", attempt+1, "retry_in", pause.String())
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

// refreshFailingBatches is how many refresh batches of a keyspace in a row must fail, with no success between,
// before RefreshFailing reports it.
const refreshFailingBatches = 3

// RefreshFailure is a keyspace none of whose recent refreshes succeeded, as RefreshFailing reports it.
type RefreshFailure struct {
	Keyspace string
	Since    time.Time // the first failed batch of the streak
	Batches  int       // failed batches in a row (at least refreshFailingBatches)
	Err      error     // the last batch's error (wrapping the Redis or PostgreSQL error, e.g. NOPERM or 42501)
}

// refreshStreak is a keyspace's run of failed refresh batches. The loop owns it; RefreshFailing reads the copy
// the loop publishes (keyspace.failing).
type refreshStreak struct {
	since   time.Time
	batches int
	err     error
}

// noteBatch folds one settled batch into the streak: any key written, found fresh or missing, or held by
// another (the keyspace works) ends it; a batch whose keys all failed extends it. A key that failed on its own
// input (ReasonBadInput) says nothing about the keyspace: a batch of such keys alone leaves the streak as it is.
func (s *refreshStreak) noteBatch(items []*item, runErr error, now time.Time) {
	var last error
	for _, it := range items {
		switch it.result {
		case ResultOK, ResultFresh, ResultMissing, ResultLocked, resultSettled:
			*s = refreshStreak{}
			return
		case ResultError:
			if it.err != nil && it.reason != ReasonBadInput {
				last = it.err
			}
		}
	}
	if last == nil && runErr != nil && !errors.Is(runErr, context.Canceled) {
		last = runErr
	}
	if last == nil {
		return
	}
	if s.batches == 0 {
		s.since = now
	}
	s.batches++
	s.err = last
}

// RefreshFailing returns the keyspaces whose last refreshFailingBatches or more refresh batches all failed with no
// success since, sorted by name, each with its last error. The daemon's /readyz reports those whose error is a
// permission denial (Redis NOPERM, PostgreSQL 42501): no retry fixes those, and the fail-safe that hides an origin
// outage cannot hide them for long.
func (w *Warmer) RefreshFailing() []RefreshFailure {
	spaces := w.keyspaces()
	var out []RefreshFailure
	for _, k := range spaces {
		s := *k.failing.Load()
		if s.batches >= refreshFailingBatches {
			out = append(out, RefreshFailure{Keyspace: k.name, Since: s.since, Batches: s.batches, Err: s.err})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Keyspace < out[j].Keyspace })
	return out
}
