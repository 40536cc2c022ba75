package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/keepwarm/keepwarm/internal/benchload"
	"github.com/redis/go-redis/v9"
)

// sampleTop is how many of the most popular ids per keyspace the TTL sampler watches.
const sampleTop = 200

// ttlSampler watches the most popular keys' expiries (PTTL) to see every write: it checks that each written TTL lies
// in [ttl, ttl×(1+jitter)] and measures the gap between successive writes of one key, which shows any key
// rebuilt twice within one TTL (by the daemon, an app, or both).
type ttlSampler struct {
	mu     sync.Mutex
	spaces map[string]*sampled
}

type sampled struct {
	ttl     time.Duration
	jitter  float64
	lastExp map[string]int64 // id → expiry (Redis ms) last seen
	lastW   map[string]int64 // id → when its last write was seen (Redis ms, the sample that saw it)
	prevAt  int64            // the previous sample's Redis time (ms); 0 before the first
	writes  int
	outside int           // written TTLs outside [ttl, ttl×(1+jitter)] (20 ms tolerance)
	minTTL  time.Duration // smallest and largest written TTL seen
	maxTTL  time.Duration
	minGap  time.Duration // smallest gap between two writes of one key
	doubles int           // gaps shorter than ttl/2: a key rebuilt twice within one TTL
}

func (s *ttlSampler) run(ctx context.Context, rdb redis.UniversalClient, spaces []*benchload.Space) {
	s.spaces = map[string]*sampled{}
	for _, ls := range spaces {
		s.spaces[ls.Name] = &sampled{ttl: ls.Keyspace.TTL, jitter: ls.Keyspace.Jitter, lastExp: map[string]int64{},
			lastW: map[string]int64{}}
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

func (s *ttlSampler) sample(ctx context.Context, rdb redis.UniversalClient, ls *benchload.Space) {
	n := min(sampleTop, len(ls.IDs))
	pipe := rdb.Pipeline()
	now := pipe.Time(ctx)
	type q struct {
		id   string
		pttl *redis.DurationCmd
	}
	qs := make([]q, 0, n)
	for _, id := range ls.IDs[:n] {
		ks, err := ls.Keyspace.Keys().For(id)
		if err != nil {
			continue
		}
		qs = append(qs, q{id, pipe.PTTL(ctx, ks.Cache)})
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return
	}
	nowMs := now.Val().UnixMilli()
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.spaces[ls.Name]
	prevAt := sp.prevAt
	sp.prevAt = nowMs
	for _, x := range qs {
		pttl := x.pttl.Val()
		if pttl <= 0 {
			continue
		}
		// A write shows as the key's expiry moving later (PTTL works whether or not the value has a meta hash).
		// It happened after the previous sample and before this one, so the TTL it wrote lies in
		// [pttl, pttl + (now − previous sample)].
		exp := nowMs + pttl.Milliseconds()
		prevExp, seen := sp.lastExp[x.id]
		sp.lastExp[x.id] = exp
		if !seen || prevAt == 0 || exp <= prevExp+expiryMoveMs {
			continue // first sight (write time unknown), or no new write
		}
		sp.writes++
		lo, hi := pttl, pttl+time.Duration(nowMs-prevAt)*time.Millisecond
		if sp.minTTL == 0 || hi < sp.minTTL {
			sp.minTTL = hi
		}
		sp.maxTTL = max(sp.maxTTL, lo)
		want0, want1 := sp.ttl-20*time.Millisecond, time.Duration(float64(sp.ttl)*(1+sp.jitter))+20*time.Millisecond
		if hi < want0 || lo > want1 {
			sp.outside++
		}
		if prevW, ok := sp.lastW[x.id]; ok {
			gap := time.Duration(nowMs-prevW) * time.Millisecond // ± one sample interval
			if sp.minGap == 0 || gap < sp.minGap {
				sp.minGap = gap
			}
			if gap < sp.ttl/2 {
				sp.doubles++
			}
		}
		sp.lastW[x.id] = nowMs
	}
}

// expiryMoveMs is how far (ms) a key's expiry must move later between two samples to count as a new write:
// above the jitter of reading PTTL and TIME in one pipeline.
const expiryMoveMs = 50

func (s *ttlSampler) report(w io.Writer, spaces []*benchload.Space) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(w, "\nwrites seen on the %d most popular keys per keyspace (an expiry moving later, by PTTL sampled every 250 ms;\nwritten TTLs and gaps are known to one sample interval):\n", sampleTop)
	for _, ls := range spaces {
		sp := s.spaces[ls.Name]
		if sp == nil {
			continue
		}
		gap := "n/a (no key written twice)"
		if sp.minGap > 0 {
			gap = sp.minGap.Round(time.Millisecond).String()
		}
		fmt.Fprintf(w, "  %-11s writes %5d  written TTL %v..%v (allowed %v..%v): %d outside;  min gap between writes of one key %s (ttl %v): %d under ttl/2\n",
			ls.Name, sp.writes, sp.minTTL.Round(time.Millisecond), sp.maxTTL.Round(time.Millisecond), sp.ttl,
			time.Duration(float64(sp.ttl)*(1+sp.jitter)), sp.outside, gap, sp.ttl, sp.doubles)
	}
}
