package lockstep

import (
	"context"
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
)

// Write is one value to publish under a lock with Publish or PublishMany.
type Write struct {
	Keys     KeySet        // the id's keys; Cache, Lock and Meta are required, Stale is optional
	Token    string        // the token the caller's lock was acquired with
	Value    []byte        // stored as given, no envelope; ignored when Delete
	TTL      time.Duration // cache TTL, already jittered (see Jitter); > 0 unless Delete; rounded up to ms
	StaleTTL time.Duration // > 0 also writes Keys.Stale (when Keys.Stale != "") with this TTL; 0 leaves it alone
	Rebuild  time.Duration // δ, the rebuild's duration (≥ 0), stored in the meta hash for XFetch
	Delete   bool          // delete cache, meta and stale instead of writing (the origin row is gone)
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
		return scriptCall{publishScript, keys, []any{w.Token, "del", "", 0, 0, 0}}, nil
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
	return scriptCall{publishScript, keys, []any{w.Token, "set", w.Value, millis(w.TTL), deltaMs, staleMs}}, nil
}

// publishResult maps publish.lua's reply: 1 written, 0 lock lost.
func publishResult(cmd *redis.Cmd) error {
	n, err := cmd.Int64()
	switch {
	case err != nil:
		return err
	case n == 1:
		return nil
	default:
		return ErrLockLost
	}
}

// Publish writes w atomically with publish.lua, only while w.Keys.Lock holds w.Token: SET the cache key with
// PX w.TTL, HSET the meta hash (MetaWrittenField, MetaDeltaField) with the same TTL, SET the stale copy with PX
// w.StaleTTL when asked, then DEL the lock. With w.Delete it deletes the cache key, meta and stale copy instead.
// One round trip (EVALSHA; EVAL once more on NOSCRIPT). It returns nil, ErrLockLost when the lock no longer holds
// the token (nothing was written: the lock expired and maybe a newer value is in place), ErrInvalidArgument for
// a malformed w, or the transport error.
func Publish(ctx context.Context, c redis.UniversalClient, w Write) error {
	call, err := w.call()
	if err != nil {
		return err
	}
	cmd := call.script.Run(ctx, c, call.keys, call.args...)
	if err := publishResult(cmd); err != nil {
		if err == ErrLockLost {
			return err
		}
		return fmt.Errorf("lockstep: publish %q: %w", w.Keys.Cache, err)
	}
	return nil
}

// PublishMany is Publish for many writes in one pipelined round trip (plus one SCRIPT LOAD and a retry round
// trip only when the server answers NOSCRIPT). In a Redis Cluster the pipeline is split by node; each write
// touches one id's keys, which Keys.CheckCluster keeps in one slot. The first result has one entry per write, in
// order: nil, ErrLockLost, or that write's error reply (e.g. WRONGTYPE). The second is ErrInvalidArgument (naming
// the write's index; nothing was sent) or a transport failure (then the first is nil and any write may or may not
// have happened).
func PublishMany(ctx context.Context, c redis.UniversalClient, ws []Write) ([]error, error) {
	calls := make([]scriptCall, len(ws))
	for i := range ws {
		call, err := ws[i].call()
		if err != nil {
			return nil, fmt.Errorf("writes[%d]: %w", i, err)
		}
		calls[i] = call
	}
	out := make([]error, len(ws))
	if len(calls) == 0 {
		return out, nil
	}
	cmds, err := runPipelined(ctx, c, calls)
	if err != nil {
		return nil, fmt.Errorf("lockstep: publish %d writes: %w", len(ws), err)
	}
	for i, cmd := range cmds {
		out[i] = publishResult(cmd)
	}
	return out, nil
}

// ExtendValueMany is the fail-safe for a refresh whose origin read failed: for each KeySet, only while its lock
// holds token, it resets the TTL of the cache key and its meta hash to ttl (> 0, rounded up to ms) and deletes the
// lock (extend_value.lua), so the old value is served a while longer instead of expiring into a stampede. One
// pipelined round trip (plus a retry only on NOSCRIPT). The first result has one entry per KeySet, in order: nil
// (extended), ErrLockLost (the lock no longer holds token; nothing touched), ErrNotFound (the cache key is gone;
// nothing extended, the lock released), or that call's error reply. The second is ErrInvalidArgument or a
// transport failure.
func ExtendValueMany(ctx context.Context, c redis.UniversalClient, keys []KeySet, token string, ttl time.Duration) ([]error, error) {
	if err := checkTTL("ttl", ttl); err != nil {
		return nil, err
	}
	if token == "" {
		return nil, argError("token", "empty")
	}
	ms := millis(ttl)
	calls := make([]scriptCall, len(keys))
	for i, k := range keys {
		if k.Cache == "" || k.Lock == "" || k.Meta == "" {
			return nil, fmt.Errorf("keys[%d]: %w", i, argError("key set", "cache, lock and meta keys are required"))
		}
		calls[i] = scriptCall{extendValueScript, []string{k.Cache, k.Lock, k.Meta}, []any{token, ms}}
	}
	out := make([]error, len(keys))
	if len(calls) == 0 {
		return out, nil
	}
	cmds, err := runPipelined(ctx, c, calls)
	if err != nil {
		return nil, fmt.Errorf("lockstep: extend %d values: %w", len(keys), err)
	}
	for i, cmd := range cmds {
		n, err := cmd.Int64()
		switch {
		case err != nil:
			out[i] = err
		case n == 1:
		case n == -1:
			out[i] = ErrNotFound
		default:
			out[i] = ErrLockLost
		}
	}
	return out, nil
}
