package lockstep

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// millis converts d (> 0) to whole milliseconds, rounding up so that a positive duration never becomes 0.
func millis(d time.Duration) int64 {
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms
}

func checkLockArgs(lockKey, token string) error {
	if lockKey == "" {
		return argError("lock key", "empty")
	}
	if token == "" {
		return argError("token", "empty")
	}
	return nil
}

func checkTTL(name string, ttl time.Duration) error {
	if ttl <= 0 {
		return argError(name, "%v is not > 0", ttl)
	}
	return nil
}

func acquireCmd(ctx context.Context, lockKey, token string, ttl time.Duration) *redis.StatusCmd {
	cmd := redis.NewStatusCmd(ctx, "set", lockKey, token, "nx", "px", millis(ttl))
	cmd.SetFirstKeyPos(1)
	return cmd
}

// acquired interprets the reply of SET NX: OK means the lock is ours, nil means another token holds it.
func acquired(cmd *redis.StatusCmd) (bool, error) {
	switch err := cmd.Err(); {
	case err == nil:
		return true, nil
	case errors.Is(err, redis.Nil):
		return false, nil
	default:
		return false, err
	}
}

// Acquire tries to take the lock lockKey for token with `SET lockKey token NX PX ttl_ms`. It returns true when
// the caller is now the leader, false when another token holds the lock (an expected outcome, not an error). ttl
// is the lock's lease (> 0; rounded up to whole milliseconds); a leader that needs longer calls Extend. Errors:
// ErrInvalidArgument for an empty lockKey or token or a ttl ≤ 0, else the transport error.
func Acquire(ctx context.Context, c RedisClient, lockKey, token string, ttl time.Duration) (bool, error) {
	if err := checkLockArgs(lockKey, token); err != nil {
		return false, err
	}
	if err := checkTTL("ttl", ttl); err != nil {
		return false, err
	}
	cmd := acquireCmd(ctx, lockKey, token, ttl)
	_ = c.Process(ctx, cmd)
	ok, err := acquired(cmd)
	if err != nil {
		return false, fmt.Errorf("lockstep: acquire %q: %w", lockKey, err)
	}
	return ok, nil
}

// Release deletes the lock lockKey only while it holds token (release.lua: compare-and-delete). It returns true
// when it deleted the lock, false when the lock had expired or belongs to another token (nothing changed then).
// Errors: ErrInvalidArgument for an empty lockKey or token, else the transport error.
func Release(ctx context.Context, c RedisClient, lockKey, token string) (bool, error) {
	if err := checkLockArgs(lockKey, token); err != nil {
		return false, err
	}
	n, err := releaseScript.Run(ctx, c, []string{lockKey}, token).Int64()
	if err != nil {
		return false, fmt.Errorf("lockstep: release %q: %w", lockKey, err)
	}
	return n == 1, nil
}

// Extend resets the TTL of the lock lockKey to ttl (> 0, rounded up to whole milliseconds) only while it holds
// token (extend.lua); a leader whose rebuild runs long calls it as a lease watchdog, e.g. every ttl/3. It returns
// true when extended, false when the lock had expired or belongs to another token (nothing changed then: the
// leader has lost the lock and its Publish will return ErrLockLost). Errors: ErrInvalidArgument, or the
// transport error.
func Extend(ctx context.Context, c RedisClient, lockKey, token string, ttl time.Duration) (bool, error) {
	if err := checkLockArgs(lockKey, token); err != nil {
		return false, err
	}
	if err := checkTTL("ttl", ttl); err != nil {
		return false, err
	}
	n, err := extendScript.Run(ctx, c, []string{lockKey}, token, millis(ttl)).Int64()
	if err != nil {
		return false, fmt.Errorf("lockstep: extend %q: %w", lockKey, err)
	}
	return n == 1, nil
}

// AcquireMany is Acquire for many locks in one pipelined round trip, all with the same token and ttl (> 0). The
// result has one entry per lock key, in order: true where the caller now holds the lock, false where another
// token holds it (or where the same key came earlier in lockKeys, or where its command got an error reply).
// Errors: ErrInvalidArgument; ReplyErrors when some commands got an error reply (OOM, TRYAGAIN, ...; the result
// is valid for the others); or the transport error, with a nil result. After a transport error (a timeout while
// Redis was frozen, say) the commands may still run when Redis wakes and leave the locks held for ttl: call
// ReleaseMany with the same token once Redis answers again; it only deletes locks that hold this token.
func AcquireMany(ctx context.Context, c RedisClient, lockKeys []string, token string, ttl time.Duration) ([]bool, error) {
	if err := checkTTL("ttl", ttl); err != nil {
		return nil, err
	}
	for i, k := range lockKeys {
		if err := checkLockArgs(k, token); err != nil {
			return nil, fmt.Errorf("lock keys[%d]: %w", i, err)
		}
	}
	out := make([]bool, len(lockKeys))
	if len(lockKeys) == 0 {
		return out, nil
	}
	cmds := make([]*redis.StatusCmd, len(lockKeys))
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range lockKeys {
			cmds[i] = acquireCmd(ctx, k, token, ttl)
			_ = p.Process(ctx, cmds[i])
		}
		return nil
	})
	var replies ReplyErrors
	for i, cmd := range cmds {
		ok, err := acquired(cmd)
		switch {
		case err == nil:
			out[i] = ok
		case isRedisError(err):
			if replies == nil {
				replies = ReplyErrors{}
			}
			replies[i] = err
		default:
			return nil, fmt.Errorf("lockstep: acquire %d locks: %w", len(lockKeys), err)
		}
	}
	if replies != nil {
		return out, replies
	}
	return out, nil
}

// ReplyErrors holds the error replies of some commands of a pipelined call, by index; the other commands ran
// normally. Match it with errors.As.
type ReplyErrors map[int]error

func (e ReplyErrors) Error() string {
	first := -1
	for i := range e {
		if first < 0 || i < first {
			first = i
		}
	}
	return fmt.Sprintf("lockstep: %d commands answered with an error reply; the first, [%d]: %v", len(e), first, e[first])
}

// ReleaseMany is Release for many locks held by token, in one pipelined round trip (plus one SCRIPT LOAD and a
// retry round trip only when the server answers NOSCRIPT). Locks that expired or belong to another token are left
// alone. Errors: ErrInvalidArgument, the transport error, or the first error reply.
func ReleaseMany(ctx context.Context, c RedisClient, lockKeys []string, token string) error {
	calls := make([]scriptCall, len(lockKeys))
	for i, k := range lockKeys {
		if err := checkLockArgs(k, token); err != nil {
			return fmt.Errorf("lock keys[%d]: %w", i, err)
		}
		calls[i] = scriptCall{releaseScript, []string{k}, []any{token}}
	}
	if len(calls) == 0 {
		return nil
	}
	cmds, err := runPipelined(ctx, c, calls)
	if err != nil {
		return fmt.Errorf("lockstep: release %d locks: %w", len(lockKeys), err)
	}
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			return fmt.Errorf("lockstep: release %q: %w", lockKeys[i], err)
		}
	}
	return nil
}

// ExtendMany is Extend for many locks held by token, in one pipelined round trip (plus a retry only on
// NOSCRIPT). The result has one entry per lock key, in order: true where the TTL was reset to ttl, false where the
// lock had expired or belongs to another token. Errors: ErrInvalidArgument, the transport error, or the first
// error reply.
func ExtendMany(ctx context.Context, c RedisClient, lockKeys []string, token string, ttl time.Duration) ([]bool, error) {
	if err := checkTTL("ttl", ttl); err != nil {
		return nil, err
	}
	calls := make([]scriptCall, len(lockKeys))
	ms := millis(ttl)
	for i, k := range lockKeys {
		if err := checkLockArgs(k, token); err != nil {
			return nil, fmt.Errorf("lock keys[%d]: %w", i, err)
		}
		calls[i] = scriptCall{extendScript, []string{k}, []any{token, ms}}
	}
	out := make([]bool, len(lockKeys))
	if len(calls) == 0 {
		return out, nil
	}
	cmds, err := runPipelined(ctx, c, calls)
	if err != nil {
		return nil, fmt.Errorf("lockstep: extend %d locks: %w", len(lockKeys), err)
	}
	for i, cmd := range cmds {
		n, err := cmd.Int64()
		if err != nil {
			return nil, fmt.Errorf("lockstep: extend %q: %w", lockKeys[i], err)
		}
		out[i] = n == 1
	}
	return out, nil
}
