package lockstep

import (
	"errors"
	"fmt"
)

// Sentinel errors. Match them with errors.Is; the functions of this package wrap them with context.
var (
	// ErrLockLost is returned when a write, release or extension finds the lock no longer holding the caller's
	// token: the lock expired (the rebuild outlived the lock TTL) and maybe another leader took it. Nothing was
	// written; a newer value is never overwritten.
	ErrLockLost = errors.New("lockstep: lock lost")
	// ErrLockGone is returned when a write finds the lock key gone although the caller took it: the lease ran
	// out, Redis evicted the lock under memory pressure, or an app invalidated the key (Invalidate) because the
	// origin changed. Nothing was written. It matches ErrLockLost with errors.Is.
	ErrLockGone = fmt.Errorf("%w: lock key gone (expired, evicted or invalidated)", ErrLockLost)
	// ErrLockHeld is reported by ExtendValueUnlockedMany for a value whose lock key exists: an app or a daemon is
	// rebuilding it, so its publish decides, and nothing was touched.
	ErrLockHeld = errors.New("lockstep: lock held: a rebuild is under way")
	// ErrStaleLimit is reported by ExtendValueMany and ExtendValueUnlockedMany for a value that has been stale
	// (kept past its TTL) for max_stale already, across every process: it is not extended and expires on its TTL.
	ErrStaleLimit = errors.New("lockstep: stale limit reached")
	// ErrNotFound means a record does not exist. A Loader returns an error wrapping it when the origin has no row
	// for the id (Client.Get then returns that error and caches nothing); ExtendValueMany and ExtendValueUnlockedMany
	// report it for a cache key that is gone.
	ErrNotFound = errors.New("lockstep: not found")
	// ErrRebuildTimeout is returned by Client.Get to a follower that waited the whole wait budget (see Backoff) for
	// another process's rebuild, and found neither a fresh value nor a stale copy.
	ErrRebuildTimeout = errors.New("lockstep: rebuild timeout")
	// ErrInvalidArgument is wrapped by every error about a bad argument or option; the message names the argument,
	// e.g. "lockstep: invalid argument: jitter: 1.5 is outside [0, 1]".
	ErrInvalidArgument = errors.New("lockstep: invalid argument")
	// ErrRedisTimeout is wrapped by the error of a Client call whose Redis round trip did not finish within the
	// Redis timeout (WithRedisTimeout); errors.Is(err, context.DeadlineExceeded) holds too.
	ErrRedisTimeout = errors.New("lockstep: redis timeout")
	// ErrClosed is returned by Client.Get and Client.Invalidate after Client.Close.
	ErrClosed = errors.New("lockstep: client closed")
)

// argError returns an error wrapping ErrInvalidArgument that names the argument.
func argError(name, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidArgument, name, fmt.Sprintf(format, args...))
}
