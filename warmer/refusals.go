package warmer

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Redis can answer pings and reads while it refuses every write: at maxmemory with noeviction (OOM), on a replica
// (READONLY), or for an ACL user that may read the keys but not write them (NOPERM). Then no hot key can be
// refreshed, yet a ping-only readiness check passes. The warmer learns it from writes it makes anyway: the flush
// canary's SET on every master every FlushCheckInterval (flush.go), and the lock acquisitions and publishes of
// every refresh batch (pipeline.go). Warmer.WritesRefused reports it.

// Error codes of the replies by which Redis refuses a write (WriteRefusedError.Code).
const (
	RefusedOOM      = "OOM"      // used memory > maxmemory and nothing can be evicted (noeviction)
	RefusedReadOnly = "READONLY" // the server is a replica
	RefusedNoPerm   = "NOPERM"   // the ACL user may not run the command, or not on these keys
)

// WriteRefusedError is Redis refusing the warmer's writes, as Warmer.WritesRefused reports it.
type WriteRefusedError struct {
	// Code is the reply's error code: RefusedOOM, RefusedReadOnly or RefusedNoPerm.
	Code string
	// Op is the write that was refused: "flush canary", "lock" or "publish".
	Op string
	// Since is when the first refusal with this code was seen, with no accepted write since.
	Since time.Time
	// Err is the reply.
	Err error
}

func (e *WriteRefusedError) Error() string { return "redis refuses writes: " + e.Err.Error() }

func (e *WriteRefusedError) Unwrap() error { return e.Err }

// refusalCode returns the code of an error reply by which Redis refuses a write (RefusedX), or "" for any other
// error or nil.
func refusalCode(err error) string {
	for _, code := range []string{RefusedOOM, RefusedReadOnly, RefusedNoPerm} {
		if redis.HasErrorPrefix(err, code) {
			return code
		}
	}
	return ""
}

// firstRefusal returns the first of errs that is a refusal of a write (refusalCode), or nil.
func firstRefusal(errs []error) error {
	for _, err := range errs {
		if refusalCode(err) != "" {
			return err
		}
	}
	return nil
}

// writeRefusals is what the warmer last learnt of Redis taking its writes, in two slots, each written by one
// kind of writer: canary by the flush canary's loop alone (watchFlush), pipeline by the refresh batches (the
// last batch to learn something wins). A refusal is kept until a write of the same kind succeeds; a canary round
// that every master took also ends a pipeline refusal that is server-wide (OOM, READONLY), but not a NOPERM,
// which may concern the cache keys alone (an ACL that lets the daemon write keepwarm:* only).
type writeRefusals struct {
	canary   atomic.Pointer[WriteRefusedError]
	pipeline atomic.Pointer[WriteRefusedError]
}

// note records the outcome of writes of op in slot at now: refused, when not nil, is a refusal of one of them
// (refusalCode); else accepted tells whether one of them succeeded. Neither: nothing learnt.
func note(slot *atomic.Pointer[WriteRefusedError], op string, refused error, accepted bool, now time.Time) {
	if code := refusalCode(refused); code != "" {
		since := now
		if prev := slot.Load(); prev != nil && prev.Code == code {
			since = prev.Since
		}
		slot.Store(&WriteRefusedError{Code: code, Op: op, Since: since, Err: refused})
		return
	}
	if accepted {
		slot.Store(nil)
	}
}

// noteCanary records one round of the flush canary: refused is a refusal of one canary's SET (nil if none),
// allOK whether every canary's SET succeeded.
func (r *writeRefusals) noteCanary(refused error, allOK bool, now time.Time) {
	note(&r.canary, "flush canary", refused, allOK && refused == nil, now)
	if allOK && refused == nil {
		if p := r.pipeline.Load(); p != nil && p.Code != RefusedNoPerm {
			r.pipeline.CompareAndSwap(p, nil)
		}
	}
}

// notePipeline records the replies to one batch's writes of op ("lock" or "publish"): refused as for note,
// accepted whether a write was taken.
func (r *writeRefusals) notePipeline(op string, refused error, accepted bool, now time.Time) {
	note(&r.pipeline, op, refused, accepted, now)
}

// WritesRefused returns a *WriteRefusedError while Redis refuses the warmer's writes (OOM, READONLY, NOPERM), as
// last seen by the flush canary's SET on every master (every FlushCheckInterval) or by a refresh batch's lock
// acquisition or publish, and nil once writes succeed again (or before any was tried). The canary's view comes
// first. Safe for concurrent use; no I/O.
func (w *Warmer) WritesRefused() error {
	if e := w.refusals.canary.Load(); e != nil {
		return e
	}
	if e := w.refusals.pipeline.Load(); e != nil {
		return e
	}
	return nil
}

// registerRefusals registers keepwarm_warmer_redis_writes_refused{code} on reg (nil: nothing): 1 for the code of
// the refusal WritesRefused reports now, 0 for the others.
func (w *Warmer) registerRefusals(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	var errs []error
	for _, code := range []string{RefusedOOM, RefusedReadOnly, RefusedNoPerm} {
		errs = append(errs, reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "keepwarm_warmer_redis_writes_refused",
			Help:        "1 while Redis refuses the warmer's writes with this error code (OOM: maxmemory with noeviction; READONLY: a replica; NOPERM: the ACL), else 0. /readyz fails meanwhile.",
			ConstLabels: prometheus.Labels{"code": code},
		}, func() float64 {
			var e *WriteRefusedError
			if errors.As(w.WritesRefused(), &e) && e.Code == code {
				return 1
			}
			return 0
		})))
	}
	return errors.Join(errs...)
}
