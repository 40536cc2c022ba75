package warmer

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/lockstep"
)

// Sources of invalid ids, the values of the "source" label of keepwarm_warmer_invalid_ids_total.
const (
	sourceAccessSet = "access_set" // members of the access sorted set; they are removed from it
	sourceLFU       = "lfu"        // cache keys found by the LFU scan whose id part is not a valid id; left alone
	sourceChanges   = "changes"    // ids of the change stream (refresh mode) that are not valid ids; not refreshed
	// sourceOrigin: ids whose origin query failed with a data error on their own (ReasonBadInput), found by
	// splitting their batch; not written, retried with back-off.
	sourceOrigin = "origin"
)

// invalidLogEvery is how often, at most, a keyspace logs its summary of the invalid ids it skipped. A client that
// can ZINCRBY the access set can add any number of them; one line per id per poll once wrote 43 MB in 20 s.
const invalidLogEvery = time.Minute

// removeChunk bounds the members of one ZREM, so that removing a flood of invalid members never blocks Redis.
const removeChunk = 1000

// invalidIDs accumulates the invalid ids a keyspace skipped since its last summary line. The loop owns it
// (loopState.invalid).
type invalidIDs struct {
	logged  time.Time      // when the last summary was logged; zero before the first
	pending map[string]int // skipped since then, by source
	example string         // one of them, Go-quoted and truncated
}

// skipInvalid records ids (skipped by source, never made hot) in the metric and the pending summary, and logs
// the summary when one is due. For the access set it also removes them (ZREM), so they cost nothing at the
// next poll, and returns how many members it removed (0 when Redis failed; the error is logged).
func (k *keyspace) skipInvalid(ctx context.Context, cfg KeyspaceConfig, source string, ids []string) (removed int64) {
	if len(ids) == 0 {
		return 0
	}
	if source == sourceAccessSet {
		pipe := k.w.rdb.Pipeline()
		var cmds []*redis.IntCmd
		for start := 0; start < len(ids); start += removeChunk {
			chunk := ids[start:min(start+removeChunk, len(ids))]
			members := make([]any, len(chunk))
			for i, id := range chunk {
				members[i] = id
			}
			cmds = append(cmds, pipe.ZRem(ctx, cfg.AccessKey, members...))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			k.redisError(ctx, "remove invalid ids from the access set", err)
		} else {
			for _, c := range cmds {
				removed += c.Val()
			}
		}
	}
	k.w.m.invalidIDs.WithLabelValues(cfg.Name, source).Add(float64(len(ids)))
	ex := ids[0]
	if len(ex) > 64 {
		ex = ex[:64] // a prefix of a long id is enough to find it; the quoting shows every byte
	}
	n := len(ids)
	k.mail.Send(func(k *loopState) { // the summary is the loop's (called from batches and the change stream too)
		if k.invalid.pending == nil {
			k.invalid.pending = make(map[string]int)
		}
		k.invalid.pending[source] += n
		if k.invalid.example == "" {
			k.invalid.example = strconv.Quote(ex)
		}
		k.logInvalid()
	})
	return removed
}

// logInvalid logs the pending summary of invalid ids if there is one and the last was at least
// invalidLogEvery ago. poll calls it every time, so a summary left pending is logged one interval later even
// when no new invalid id arrives.
func (k *loopState) logInvalid() {
	if len(k.invalid.pending) == 0 {
		return
	}
	now := k.w.now()
	if !k.invalid.logged.IsZero() && now.Sub(k.invalid.logged) < invalidLogEvery {
		return
	}
	args := []any{"example", k.invalid.example, "max_id_bytes", lockstep.MaxIDBytes,
		"summary_every", invalidLogEvery.String()}
	for _, src := range []string{sourceAccessSet, sourceLFU, sourceChanges, sourceOrigin} {
		if n := k.invalid.pending[src]; n > 0 {
			args = append(args, src, n)
		}
	}
	k.log.Warn("skipped invalid ids: not valid UTF-8, empty, too long, emptying the hash tag or refused by the source "+
		"(a NUL byte), or failing the origin query on their own (origin: a data error); access-set members removed, "+
		"never made hot; origin ids retried with back-off", args...)
	k.invalid.logged, k.invalid.pending, k.invalid.example = now, nil, ""
}
