package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/lockstep"
)

// sampleTop is how many of the most popular ids per keyspace the TTL sampler watches.
const sampleTop = 200

// ttlSampler watches the most popular keys' meta hashes to see every write: it checks that each written TTL lies
// in [ttl, ttl×(1+jitter)] and measures the gap between successive writes of one key, which shows any key
// rebuilt twice within one TTL (by the daemon, an app, or both).
type ttlSampler struct {
	mu     sync.Mutex
	spaces map[string]*sampled
}

type sampled struct {
	ttl     time.Duration
	jitter  float64
	lastW   map[string]int64 // id → written_ms last seen
	writes  int
	outside int           // written TTLs outside [ttl, ttl×(1+jitter)] (20 ms tolerance)
	minTTL  time.Duration // smallest and largest written TTL seen
	maxTTL  time.Duration
	minGap  time.Duration // smallest gap between two writes of one key
	doubles int           // gaps shorter than ttl/2: a key rebuilt twice within one TTL
}

func (s *ttlSampler) run(ctx context.Context, rdb redis.UniversalClient, spaces []*loadSpace) {
	s.spaces = map[string]*sampled{}
	for _, ls := range spaces {
		s.spaces[ls.name] = &sampled{ttl: ls.ks.TTL, jitter: ls.ks.Jitter, lastW: map[string]int64{}}
	}
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, ls := range spaces {
			s.sample(ctx, rdb, ls)
		}
	}
}

func (s *ttlSampler) sample(ctx context.Context, rdb redis.UniversalClient, ls *loadSpace) {
	n := min(sampleTop, len(ls.ids))
	pipe := rdb.Pipeline()
	now := pipe.Time(ctx)
	type q struct {
		id   string
		w    *redis.StringCmd
		pttl *redis.DurationCmd
	}
	qs := make([]q, 0, n)
	for _, id := range ls.ids[:n] {
		ks, err := ls.ks.Keys().For(id)
		if err != nil {
			continue
		}
		qs = append(qs, q{id, pipe.HGet(ctx, ks.Meta, lockstep.MetaWrittenField), pipe.PTTL(ctx, ks.Cache)})
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return
	}
	nowMs := now.Val().UnixMilli()
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.spaces[ls.name]
	for _, x := range qs {
		w, err := strconv.ParseInt(x.w.Val(), 10, 64)
		if err != nil || x.pttl.Val() <= 0 {
			continue
		}
		prev, seen := sp.lastW[x.id]
		if seen && prev == w {
			continue
		}
		sp.lastW[x.id] = w
		written := x.pttl.Val() + time.Duration(nowMs-w)*time.Millisecond
		sp.writes++
		if sp.minTTL == 0 || written < sp.minTTL {
			sp.minTTL = written
		}
		sp.maxTTL = max(sp.maxTTL, written)
		lo, hi := sp.ttl-20*time.Millisecond, time.Duration(float64(sp.ttl)*(1+sp.jitter))+20*time.Millisecond
		if written < lo || written > hi {
			sp.outside++
		}
		if seen {
			gap := time.Duration(w-prev) * time.Millisecond
			if sp.minGap == 0 || gap < sp.minGap {
				sp.minGap = gap
			}
			if gap < sp.ttl/2 {
				sp.doubles++
			}
		}
	}
}

func (s *ttlSampler) report(w io.Writer, spaces []*loadSpace) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(w, "\nwrites seen on the %d most popular keys per keyspace (meta %s, sampled every 250 ms):\n", sampleTop, lockstep.MetaWrittenField)
	for _, ls := range spaces {
		sp := s.spaces[ls.name]
		if sp == nil {
			continue
		}
		gap := "n/a (no key written twice)"
		if sp.minGap > 0 {
			gap = sp.minGap.Round(time.Millisecond).String()
		}
		fmt.Fprintf(w, "  %-11s writes %5d  written TTL %v..%v (allowed %v..%v): %d outside;  min gap between writes of one key %s (ttl %v): %d under ttl/2\n",
			ls.name, sp.writes, sp.minTTL.Round(time.Millisecond), sp.maxTTL.Round(time.Millisecond), sp.ttl,
			time.Duration(float64(sp.ttl)*(1+sp.jitter)), sp.outside, gap, sp.ttl, sp.doubles)
	}
}
