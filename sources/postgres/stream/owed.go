package stream

import (
	"context"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"
)

// OwedResyncs keeps the resyncs a change stream owes in Redis (a set of reasons under one key, next to the
// stream lease: "keepwarm:stream:<slot>:resync"), so that a daemon killed between a replication slot's creation
// and the end of its resync leaves the resync to the next holder of the lease (without it, 60 of 60 updated hot
// tracks kept their old values after such a kill -9). It implements postgres.OwedStore. The key has no TTL: it
// is removed when nothing is owed.
//
// It also implements postgres.SlotHistory, with a second key (key + ":streamed", no TTL) set once the slot has
// been streamed from: a slot found missing afterwards was lost, not never created.
type OwedResyncs struct {
	rdb      redis.UniversalClient
	key      string
	streamed string
}

// NewOwedResyncs returns the store of the resyncs owed under key.
func NewOwedResyncs(rdb redis.UniversalClient, key string) *OwedResyncs {
	return &OwedResyncs{rdb: rdb, key: key, streamed: key + ":streamed"}
}

// Streamed reports whether MarkStreamed was ever called for this store's slot.
func (o *OwedResyncs) Streamed(ctx context.Context) (bool, error) {
	n, err := o.rdb.Exists(ctx, o.streamed).Result()
	if err != nil {
		return false, fmt.Errorf("read %q: %w", o.streamed, err)
	}
	return n > 0, nil
}

// MarkStreamed records that the slot has been streamed from.
func (o *OwedResyncs) MarkStreamed(ctx context.Context) error {
	if err := o.rdb.Set(ctx, o.streamed, "1", 0).Err(); err != nil {
		return fmt.Errorf("write %q: %w", o.streamed, err)
	}
	return nil
}

// Load returns the reasons owed, sorted; none when the key is absent. Errors are Redis's, wrapped with the key.
func (o *OwedResyncs) Load(ctx context.Context) ([]string, error) {
	r, err := o.rdb.SMembers(ctx, o.key).Result()
	if err != nil {
		return nil, fmt.Errorf("read %q: %w", o.key, err)
	}
	slices.Sort(r)
	return r, nil
}

// Save replaces the reasons owed with reasons, in one MULTI (DEL, then SADD when any are owed).
func (o *OwedResyncs) Save(ctx context.Context, reasons []string) error {
	_, err := o.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, o.key)
		if len(reasons) > 0 {
			members := make([]any, len(reasons))
			for i, r := range reasons {
				members[i] = r
			}
			p.SAdd(ctx, o.key, members...)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("write %q: %w", o.key, err)
	}
	return nil
}
