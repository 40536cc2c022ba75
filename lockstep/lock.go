package lockstep

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
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

// acquireOp is one lock acquisition: `SET <lock> <token> NX PX <ms> GET` (Redis >= 7.0), or the plain `SET <lock>
// <token> NX PX <ms>` of the fallback for servers that refuse NX together with GET.
//
// Why GET: go-redis re-sends a command whose connection failed before the reply came back (MaxRetries, 3 by
// default, also in pipelines). When the first SET NX did run, the re-sent one finds the caller's own lock and
// answers nil, which a plain SET NX cannot tell from another holder: the caller would walk away from a lock it
// holds, and the key would stay locked for the whole TTL. With GET the reply names the holder: nil means the key
// was absent and this command set it, and the old value equal to our token means an earlier copy of this command
// set it. Tokens are unique, so either way the lock is ours; in the second case its TTL is then reset with
// extend.lua (the SET did not touch it), so that a held lock lives at least ttl from the call even for a caller
// that reuses a token. The fallback gets the same answer in a second round trip: after a nil reply it GETs the
// lock and compares the value with the token (only on contention).
type acquireOp struct {
	key, token string
	ttl        time.Duration
	get        bool // the command carries GET
	cmd        *redis.Cmd
}

func newAcquireOp(ctx context.Context, c RedisClient, key, token string, ttl time.Duration) *acquireOp {
	op := &acquireOp{key: key, token: token, ttl: ttl, get: !refusesSetGet(c)}
	op.build(ctx)
	return op
}

func (op *acquireOp) build(ctx context.Context) {
	args := []any{"set", op.key, op.token, "nx", "px", millis(op.ttl)}
	if op.get {
		args = append(args, "get")
	}
	op.cmd = redis.NewCmd(ctx, args...)
	op.cmd.SetFirstKeyPos(1)
}

// noSetGet holds the clients (RedisClient values) whose server refused SET NX GET with a syntax error (Redis
// < 7.0): they use the fallback from then on, without a refused round trip first. It is never cleared; after an
// upgrade a new client uses GET again.
var noSetGet sync.Map

func refusesSetGet(c RedisClient) bool {
	if c == nil || !reflect.TypeOf(c).Comparable() {
		return false
	}
	_, ok := noSetGet.Load(c)
	return ok
}

func markRefusesSetGet(c RedisClient) {
	if c != nil && reflect.TypeOf(c).Comparable() {
		noSetGet.Store(c, struct{}{})
	}
}

// refusedSetGet reports whether err is the reply of a server that does not accept NX together with GET: Redis
// < 7.0 answers "ERR syntax error" (redis.HasErrorPrefix drops the "ERR ").
func refusedSetGet(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "syntax error")
}

// finishAcquires settles ops whose first round trip has run (on their own or in a caller's pipeline). Ops the
// server refused for NX+GET are re-sent as plain SET NX in one pipeline; a plain SET NX answered nil is followed
// by a GET of the lock, in one more pipeline, that compares its value with the token. A lock found holding our
// token already gets its TTL reset by extend.lua (one more round trip, only then). It returns, per op, whether
// the caller now holds the lock and that op's error reply (OOM, TRYAGAIN, ...; held is false then), or the first
// transport error (then nothing else is meaningful: any SET may still have run).
func finishAcquires(ctx context.Context, c RedisClient, ops []*acquireOp) (held []bool, replies []error, err error) {
	var resend []*acquireOp
	for _, op := range ops {
		if op.get && refusedSetGet(op.cmd.Err()) {
			op.get = false
			op.build(ctx)
			resend = append(resend, op)
		}
	}
	if len(resend) > 0 {
		markRefusesSetGet(c)
		_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, op := range resend {
				_ = p.Process(ctx, op.cmd)
			}
			return nil
		})
	}
	held = make([]bool, len(ops))
	replies = make([]error, len(ops))
	var check, own []int
	for i, op := range ops {
		v, err := op.cmd.Text()
		switch {
		case errors.Is(err, redis.Nil) && op.get:
			held[i] = true // the key was absent: this SET set it
		case errors.Is(err, redis.Nil):
			check = append(check, i) // plain SET NX: another holder, or our own lock found by a re-sent copy
		case err == nil && op.get:
			if v == op.token { // an earlier copy of this command took it (or the caller reused a token)
				own = append(own, i)
			}
		case err == nil:
			held[i] = true // OK
		case isRedisError(err):
			replies[i] = err
		default:
			return nil, nil, err
		}
	}
	if len(check) > 0 {
		gets := make([]*redis.StringCmd, len(check))
		_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for j, i := range check {
				gets[j] = p.Get(ctx, ops[i].key)
			}
			return nil
		})
		for j, i := range check {
			v, err := gets[j].Result()
			switch {
			case err == nil && v == ops[i].token:
				own = append(own, i)
			case err == nil, errors.Is(err, redis.Nil):
				// Another holder, or its lock is gone already; ours would still be there (or have lapsed).
			case isRedisError(err):
				replies[i] = err
			default:
				return nil, nil, err
			}
		}
	}
	if len(own) == 0 {
		return held, replies, nil
	}
	// Our own token was there already: the SET did not (re)set the TTL, so reset it to ttl now, token-checked
	// (extend.lua), so that a held lock always lives at least ttl from the call, also for a caller that reuses
	// a token. A lock that lapsed meanwhile is not held.
	calls := make([]scriptCall, len(own))
	for j, i := range own {
		calls[j] = scriptCall{extendScript, []string{ops[i].key}, []any{ops[i].token, millis(ops[i].ttl)}}
	}
	cmds, err := runPipelined(ctx, c, calls)
	if err != nil {
		return nil, nil, err
	}
	for j, i := range own {
		n, err := cmds[j].Int64()
		switch {
		case err == nil:
			held[i] = n == 1
		case isRedisError(err):
			replies[i] = err
		default:
			return nil, nil, err
		}
	}
	return held, replies, nil
}

// acquireAll runs ops in one round trip (one pipeline; a single command when single is set and there is one op)
// and settles them (finishAcquires).
func acquireAll(ctx context.Context, c RedisClient, ops []*acquireOp, single bool) ([]bool, []error, error) {
	if single && len(ops) == 1 {
		_ = c.Process(ctx, ops[0].cmd)
		return finishAcquires(ctx, c, ops)
	}
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, op := range ops {
			_ = p.Process(ctx, op.cmd)
		}
		return nil
	})
	return finishAcquires(ctx, c, ops)
}

// Acquire tries to take the lock lockKey for token with `SET lockKey token NX PX ttl_ms GET`. It returns true when
// the caller is now the leader, false when another token holds the lock (an expected outcome, not an error). A
// copy of the command re-sent by go-redis after a lost reply recognises the caller's own token, so a lock is never
// lost to a retry. Servers older than Redis 7.0 refuse NX with GET: then (and from then on for c) it sends a plain
// SET NX and, when that answers nil, a GET of the lock that compares the token (one more round trip, on
// contention only). ttl is the lock's lease (> 0; rounded up to whole milliseconds); a leader that needs longer
// calls Extend. Errors: ErrInvalidArgument for an empty lockKey or token or a ttl ≤ 0, the error reply (OOM,
// TRYAGAIN, ...), else the transport error.
func Acquire(ctx context.Context, c RedisClient, lockKey, token string, ttl time.Duration) (bool, error) {
	if err := checkLockArgs(lockKey, token); err != nil {
		return false, err
	}
	if err := checkTTL("ttl", ttl); err != nil {
		return false, err
	}
	held, replies, err := acquireAll(ctx, c, []*acquireOp{newAcquireOp(ctx, c, lockKey, token, ttl)}, true)
	if err == nil {
		err = replies[0]
	}
	if err != nil {
		return false, fmt.Errorf("lockstep: acquire %q: %w", lockKey, err)
	}
	return held[0], nil
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

// AcquireMany is Acquire for many locks in one pipelined round trip (two or three on a server older than Redis
// 7.0, see Acquire), all with the same token and ttl (> 0). The
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
	// A key that came earlier is not sent again: with GET its second SET would find our own token and report the
	// lock held twice.
	ops := make([]*acquireOp, 0, len(lockKeys))
	idx := make([]int, 0, len(lockKeys)) // ops[j] is lockKeys[idx[j]]
	seen := make(map[string]bool, len(lockKeys))
	for i, k := range lockKeys {
		if seen[k] {
			continue
		}
		seen[k] = true
		ops = append(ops, newAcquireOp(ctx, c, k, token, ttl))
		idx = append(idx, i)
	}
	held, errs, err := acquireAll(ctx, c, ops, false)
	if err != nil {
		return nil, fmt.Errorf("lockstep: acquire %d locks: %w", len(lockKeys), err)
	}
	var replies ReplyErrors
	for j, err := range errs {
		if err != nil {
			if replies == nil {
				replies = ReplyErrors{}
			}
			replies[idx[j]] = err
			continue
		}
		out[idx[j]] = held[j]
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
