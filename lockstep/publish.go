package lockstep

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Fields of the meta hash that Publish writes beside each value (key from the meta template, default
// "meta:${key}"); it expires with the value.
const (
	// MetaWrittenField holds the time of the write, in Unix milliseconds by the Redis server's clock.
	MetaWrittenField = "written_ms"
	// MetaDeltaField holds δ, the duration of the rebuild that produced the value, in milliseconds. XFetch uses it.
	MetaDeltaField = "delta_ms"
	// MetaStaleSinceField holds, while a value is kept past its TTL by the fail-safe (ExtendValueMany), the time
	// its staleness began (its original expiry), in Unix milliseconds by the Redis server's clock. Publish clears
	// it. Every process bounds its extensions by it, so max_stale holds for a whole fleet.
	MetaStaleSinceField = "stale_since_ms"
)

// Published is what the publish script reports for one write.
type Published struct {
	// PrevTTL is the cache key's TTL just before the write: > 0 while it still existed, PrevGone when it did not
	// exist (the value had expired, or was deleted or evicted), PrevPersistent when it had no TTL.
	PrevTTL time.Duration
}

// Special values of Published.PrevTTL, as Redis's PTTL reports them.
const (
	PrevGone       = time.Duration(-2) // the key did not exist
	PrevPersistent = time.Duration(-1) // the key existed without a TTL
)

// Existed reports whether the cache key still existed when the write replaced it.
func (p Published) Existed() bool { return p.PrevTTL != PrevGone }

// Write is one value to publish under a lock with Publish or PublishMany.
type Write struct {
	Keys     KeySet        // the id's keys; Cache, Lock and Meta are required, Stale is optional
	Token    string        // the token the caller's lock was acquired with
	Value    []byte        // stored as given, no envelope; ignored when Delete
	TTL      time.Duration // cache TTL, already jittered (see Jitter); > 0 unless Delete; rounded up to ms
	StaleTTL time.Duration // > 0 also writes Keys.Stale (when Keys.Stale != "") with this TTL; 0 leaves it alone
	Rebuild  time.Duration // δ, the rebuild's duration (≥ 0), stored in the meta hash for XFetch
	Delete   bool          // delete cache, meta and stale instead of writing (the origin row is gone)
	// NoMeta writes no meta hash beside the value, and deletes the one an older write or the fail-safe
	// (ExtendValueMany's MetaStaleSinceField) left, so that the value costs Redis what a plain SET of it does.
	// Readers then have no δ in Redis: the Client's XFetch uses the rebuild time it measured itself.
	NoMeta bool
}

func (w *Write) call() (scriptCall, error) {
	switch {
	case w.Keys.Cache == "":
		return scriptCall{}, argError("write: keys.cache", "empty")
	case w.Keys.Lock == "":
		return scriptCall{}, argError("write: keys.lock", "empty")
	case w.Keys.Meta == "":
		return scriptCall{}, argError("write: keys.meta", "empty")
	case w.Token == "":
		return scriptCall{}, argError("write: token", "empty")
	case w.StaleTTL < 0:
		return scriptCall{}, argError("write: stale ttl", "%v is negative", w.StaleTTL)
	case w.Rebuild < 0:
		return scriptCall{}, argError("write: rebuild", "%v is negative", w.Rebuild)
	}
	keys := []string{w.Keys.Cache, w.Keys.Lock, w.Keys.Meta}
	if w.Delete {
		if w.Keys.Stale != "" {
			keys = append(keys, w.Keys.Stale)
		}
		return scriptCall{publishScript, keys, []any{w.Token, "del", "", 0, 0, 0, w.metaMode()}}, nil
	}
	if err := checkTTL("write: ttl", w.TTL); err != nil {
		return scriptCall{}, err
	}
	var staleMs int64
	if w.StaleTTL > 0 && w.Keys.Stale != "" {
		keys = append(keys, w.Keys.Stale)
		staleMs = millis(w.StaleTTL)
	}
	deltaMs := int64(w.Rebuild / time.Millisecond)
	return scriptCall{publishScript, keys, []any{w.Token, "set", w.Value, millis(w.TTL), deltaMs, staleMs, w.metaMode()}}, nil
}

// metaMode is publish.lua's ARGV[7].
func (w *Write) metaMode() string {
	if w.NoMeta {
		return "nometa"
	}
	return "meta"
}

// publishResult maps publish.lua's reply {status, old_pttl}: 1 written, 0 lock held by another token (ErrLockLost),
// -1 lock key gone (ErrLockGone); an error reply (e.g. WRONGTYPE, OOM, TRYAGAIN) is returned as it is.
func publishResult(cmd *redis.Cmd) (Published, error) {
	reply, err := cmd.Slice()
	if err != nil {
		return Published{}, err
	}
	if len(reply) != 2 {
		return Published{}, fmt.Errorf("lockstep: publish: unexpected reply %v", reply)
	}
	status, _ := reply[0].(int64)
	old, _ := reply[1].(int64)
	p := Published{PrevTTL: time.Duration(old) * time.Millisecond}
	if old < 0 {
		p.PrevTTL = time.Duration(old)
	}
	switch status {
	case 1:
		return p, nil
	case -1:
		return p, ErrLockGone
	default:
		return p, ErrLockLost
	}
}

// Publish writes w atomically with publish.lua, only while w.Keys.Lock holds w.Token: SET the cache key with
// PX w.TTL, HSET the meta hash (MetaWrittenField, MetaDeltaField) with the same TTL, SET the stale copy with PX
// w.StaleTTL when asked, then DEL the lock. With w.Delete it deletes the cache key, meta and stale copy instead.
// One round trip (EVALSHA; EVAL once more on NOSCRIPT). It returns nil; ErrLockLost when the lock holds another
// token, or ErrLockGone (which also matches ErrLockLost) when the lock key is gone: nothing was written then, a
// newer value is never overwritten; ErrInvalidArgument for a malformed w; an error reply (WRONGTYPE for a meta key
// that is not a hash, OOM, TRYAGAIN in a resharding Cluster: nothing was written and the lock is still held, so
// release it with Release); or the transport error (the write may or may not have happened).
func Publish(ctx context.Context, c RedisClient, w Write) error {
	_, err := PublishResult(ctx, c, w)
	return err
}

// PublishResult is Publish that also returns what the script saw: the cache key's TTL before the write.
func PublishResult(ctx context.Context, c RedisClient, w Write) (Published, error) {
	call, err := w.call()
	if err != nil {
		return Published{}, err
	}
	cmd := call.script.Run(ctx, c, call.keys, call.args...)
	p, err := publishResult(cmd)
	if err != nil && !errors.Is(err, ErrLockLost) {
		return p, fmt.Errorf("lockstep: publish %q: %w", w.Keys.Cache, err)
	}
	return p, err
}

// PublishMany is Publish for many writes in one pipelined round trip (plus one SCRIPT LOAD and a retry round
// trip only when the server answers NOSCRIPT). In a Redis Cluster the pipeline is split by node; each write
// touches one id's keys, which Keys.CheckCluster keeps in one slot. The first result has one entry per write, in
// order: the script's report (meaningful when its error is nil, ErrLockLost or ErrLockGone) and its error: nil,
// ErrLockLost, ErrLockGone, or that write's error reply (e.g. WRONGTYPE, OOM, TRYAGAIN; the lock is then still
// held). The second is ErrInvalidArgument (naming the write's index; nothing was sent) or a transport failure
// (then the first is nil and any write may or may not have happened).
func PublishMany(ctx context.Context, c RedisClient, ws []Write) ([]PublishOutcome, error) {
	calls := make([]scriptCall, len(ws))
	for i := range ws {
		call, err := ws[i].call()
		if err != nil {
			return nil, fmt.Errorf("writes[%d]: %w", i, err)
		}
		calls[i] = call
	}
	out := make([]PublishOutcome, len(ws))
	if len(calls) == 0 {
		return out, nil
	}
	cmds, err := runPipelined(ctx, c, calls)
	if err != nil {
		return nil, fmt.Errorf("lockstep: publish %d writes: %w", len(ws), err)
	}
	for i, cmd := range cmds {
		out[i].Published, out[i].Err = publishResult(cmd)
	}
	return out, nil
}

// PublishOutcome is one write's result in PublishMany.
type PublishOutcome struct {
	Published
	Err error // nil, ErrLockLost, ErrLockGone, or the write's error reply
}

// Extended is one key's result in ExtendValueMany and ExtendValueUnlockedMany.
type Extended struct {
	// TTL is the cache key's TTL after the call: the new TTL when extended, the unchanged one when the max_stale
	// bound left no room (Err is ErrStaleLimit), 0 otherwise.
	TTL time.Duration
	// Err is nil (extended), ErrStaleLimit (not extended: the value has been stale for max_stale already, or its
	// TTL is already longer than asked), ErrNotFound (the cache key is gone; nothing extended), ErrLockLost
	// (ExtendValueMany: the lock no longer holds the token; nothing touched), ErrLockHeld (ExtendValueUnlockedMany:
	// the lock key exists; nothing touched), or that call's error reply. ExtendValueMany released the lock in the
	// first three cases.
	Err error
}

// ExtendValueMany is the fail-safe for a refresh whose origin read failed: for each KeySet, only while its lock
// holds token, it extends the TTL of the cache key and its meta hash to ttl (> 0, rounded up to ms), but never
// past MetaStaleSinceField + maxStale, and deletes the lock (extend_value.lua), so the old value is served a
// while longer instead of expiring into a stampede. The start of staleness lives in the meta hash, set by the
// first extension to the value's original expiry and cleared by Publish, so every process shares one bound
// (maxStale ≥ 0). The bound is exact to the millisecond: the new expiry is one absolute time (PEXPIREAT), from one
// reading of the server's clock, and the original expiry is read with PEXPIRETIME (Redis ≥ 7.0; TIME + PTTL on
// older servers). A TTL is never shortened. One pipelined round trip (plus a retry only on NOSCRIPT). The first
// result has one entry per KeySet, in order. The second is ErrInvalidArgument or a transport failure.
func ExtendValueMany(ctx context.Context, c RedisClient, keys []KeySet, token string, ttl, maxStale time.Duration) ([]Extended, error) {
	if err := checkTTL("ttl", ttl); err != nil {
		return nil, err
	}
	if maxStale < 0 {
		return nil, argError("max stale", "%v is negative", maxStale)
	}
	if token == "" {
		return nil, argError("token", "empty")
	}
	ms := millis(ttl)
	staleMs := int64(maxStale / time.Millisecond)
	calls := make([]scriptCall, len(keys))
	for i, k := range keys {
		if k.Cache == "" || k.Lock == "" || k.Meta == "" {
			return nil, fmt.Errorf("keys[%d]: %w", i, argError("key set", "cache, lock and meta keys are required"))
		}
		calls[i] = scriptCall{extendValueScript, []string{k.Cache, k.Lock, k.Meta}, []any{token, ms, staleMs}}
	}
	out := make([]Extended, len(keys))
	if len(calls) == 0 {
		return out, nil
	}
	cmds, err := runPipelined(ctx, c, calls)
	if err != nil {
		return nil, fmt.Errorf("lockstep: extend %d values: %w", len(keys), err)
	}
	extendedResults(cmds, out, ErrLockLost)
	return out, nil
}

// ExtendValueUnlockedMany is the fail-safe for a refresh that could not take its locks because Redis refuses new
// keys: at maxmemory with maxmemory-policy noeviction, SET NX answers "OOM command not allowed when used memory >
// 'maxmemory'", so neither ExtendValueMany (which needs the lock) nor a publish can run, and hot values would
// expire into a stampede that nobody can even cache. For each KeySet whose lock key does not exist, it extends the
// TTL of the cache key and its meta hash to ttl (> 0, rounded up to ms) with extend_value_unlocked.lua, under
// ExtendValueMany's bound: never past MetaStaleSinceField + maxStale (maxStale ≥ 0), exact to the millisecond,
// shared by every process, and never shortening a TTL.
//
// It is safe without a lock because the script is atomic, writes no value and only moves an expiry later within
// the bound: while any lock on the key exists (an app or another daemon is rebuilding it) it touches nothing
// (ErrLockHeld), and the value it keeps is whatever the last publish wrote, so an old value can never replace a
// newer one, and a lock taken after it sees the value exactly as a locked fail-safe would have left it. An
// invalidation (Invalidate deletes cache, lock and meta) leaves nothing to extend (ErrNotFound).
//
// It runs under OOM: Redis refuses a script for memory only at its first write, and only if that command may
// grow memory; the script's first write is PEXPIREAT. The start of staleness must be recorded for the bound to
// hold fleet-wide, so the first extension of a value that has no meta hash (no-meta mode, Write.NoMeta) creates
// one holding MetaStaleSinceField (Redis 7.0: MEMORY USAGE 120 bytes, 225 bytes of used_memory with its TTL),
// removed by the next publish; later extensions create nothing. If Redis refuses that record, the script sets
// the cache key's expiry back and the call's error reply is returned.
//
// One pipelined round trip (plus a SCRIPT LOAD and a retry only on NOSCRIPT; Redis takes both under OOM). The first result has one entry per KeySet, in order: see Extended. The second is
// ErrInvalidArgument (ttl ≤ 0, maxStale < 0, a KeySet without cache, lock or meta key; nothing was sent) or a
// transport failure (any extension may or may not have happened).
func ExtendValueUnlockedMany(ctx context.Context, c RedisClient, keys []KeySet, ttl, maxStale time.Duration) ([]Extended, error) {
	if err := checkTTL("ttl", ttl); err != nil {
		return nil, err
	}
	if maxStale < 0 {
		return nil, argError("max stale", "%v is negative", maxStale)
	}
	ms := millis(ttl)
	staleMs := int64(maxStale / time.Millisecond)
	calls := make([]scriptCall, len(keys))
	for i, k := range keys {
		if k.Cache == "" || k.Lock == "" || k.Meta == "" {
			return nil, fmt.Errorf("keys[%d]: %w", i, argError("key set", "cache, lock and meta keys are required"))
		}
		calls[i] = scriptCall{extendValueUnlockedScript, []string{k.Cache, k.Lock, k.Meta}, []any{ms, staleMs}}
	}
	out := make([]Extended, len(keys))
	if len(calls) == 0 {
		return out, nil
	}
	cmds, err := runPipelined(ctx, c, calls)
	if err != nil {
		return nil, fmt.Errorf("lockstep: extend %d values without lock: %w", len(keys), err)
	}
	extendedResults(cmds, out, ErrLockHeld)
	return out, nil
}

// extendedResults maps the replies {status, ttl_ms} of extend_value.lua or extend_value_unlocked.lua into out: 1
// extended, 2 ErrStaleLimit, -1 ErrNotFound, 0 locked (the script's own error for it: ErrLockLost or ErrLockHeld);
// an error reply stays as it is.
func extendedResults(cmds []*redis.Cmd, out []Extended, locked error) {
	for i, cmd := range cmds {
		reply, err := cmd.Slice()
		if err != nil {
			out[i].Err = err
			continue
		}
		if len(reply) != 2 {
			out[i].Err = fmt.Errorf("lockstep: extend value: unexpected reply %v", reply)
			continue
		}
		status, _ := reply[0].(int64)
		n, _ := reply[1].(int64)
		switch status {
		case 1:
			out[i].TTL = time.Duration(n) * time.Millisecond
		case 2:
			out[i].TTL, out[i].Err = max(time.Duration(n)*time.Millisecond, 0), ErrStaleLimit
		case -1:
			out[i].Err = ErrNotFound
		default:
			out[i].Err = locked
		}
	}
}

// Invalidate is the write path's delete: after an app commits a change to the origin, it deletes the id's cache
// key, meta hash and lock in one DEL (atomic), so that a rebuild already in flight, which may have read the row
// before the commit, fails its token check at publish (ErrLockGone) and never writes the old row back. This is
// the lease invalidation of Facebook's memcache (Nishtala et al., "Scaling Memcache at Facebook", NSDI 2013).
// The stale copy is left alone. Apps in other languages do the same: DEL <cache> <lock> <meta>. Errors:
// ErrInvalidArgument for a KeySet without cache, lock or meta key, or the Redis error.
func Invalidate(ctx context.Context, c RedisClient, ks KeySet) error {
	if ks.Cache == "" || ks.Lock == "" || ks.Meta == "" {
		return argError("key set", "cache, lock and meta keys are required")
	}
	if err := c.Del(ctx, ks.Cache, ks.Lock, ks.Meta).Err(); err != nil {
		return fmt.Errorf("lockstep: invalidate %q: %w", ks.Cache, err)
	}
	return nil
}
