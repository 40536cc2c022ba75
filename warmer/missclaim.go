package warmer

import (
	"context"
	_ "embed"
	"time"

	"github.com/redis/go-redis/v9"
)

// An SLO miss is counted in exactly one replica of a fleet (docs/operations.md, "The SLO, precisely"). Two
// replicas can each see the same miss: when every replica's heartbeat lapses in one Redis outage or failover, the
// first one back owns every key for a moment and counts the gone ones as taken over from a replica that let them
// expire, while their owner, back a beat later, judges them against the expiry it knew; a stalled replica that
// wakes can judge what its heir already counted. Neither can tell from its own view that the other counted.
//
// So a replica of a fleet claims each miss in Redis before counting it (missclaim.lua): the key
// <fleet key>:missed:<keyspace>:<id> holds when the key's last counted miss was seen, for missClaimTTL. A miss
// of a value the replica knew is the one already counted when that claim was seen after the value was written
// (or first seen), and after this replica's own previous miss of the key (miss.after): one value is lost once,
// whether it expired or vanished (a flush). A miss it cannot date (a
// key found gone when taken over) is when the claim is less than two heartbeat TTLs old.
// The first claim counts; a later one is only logged (keepwarm_warmer_fleet_misses_deduplicated_total). Two real
// misses of one key less than two heartbeat TTLs apart, the second found by a replica that took the key over,
// count once: the price of counting each miss in one replica. The replicas' clocks are compared, so they must be
// synchronised (NTP) to well within that. When Redis does not answer, the claim is retried until it does, or
// counted unclaimed after missClaimGiveUp: a miss is never lost to an outage (it may then count twice). A warmer
// without a fleet counts at once.

//go:embed missclaim.lua
var missClaimLua string

// missClaimTTL is how long a claim is kept: longer than any stall after which a replica could still judge a
// miss its heir counted.
const missClaimTTL = 10 * time.Minute

// missClaimGiveUp is how long an unanswered claim is retried before the miss is counted without one.
const missClaimGiveUp = 30 * time.Second

// missClaimRetry is the pause between attempts while Redis does not answer.
const missClaimRetry = 250 * time.Millisecond

// miss is one SLO miss as countMiss saw it: what record logs and counts.
type miss struct {
	k           *keyspace
	id, why     string
	expiry      time.Time
	learnedAt   time.Time     // when the value of that expiry was written or first seen (hotState.learnedAt)
	seen        time.Time     // when it was counted (Config.Clock): the claim's date
	since       time.Duration // from the known expiry to the judgement
	shortNotice bool
	errors      int
	queued      time.Time // wall clock, for missClaimGiveUp
	// after is the date (seen) of this replica's previous miss of the key; zero: none. The count is re-armed
	// only by a value learnt since (countMiss), so a claim dated no later than after is an earlier value's loss,
	// whatever the lost value's learnedAt says.
	after time.Time
}

// record counts the miss: keepwarm_warmer_hot_expired_total (and the late-notice breakdown), Status, the log.
// It may run on the claim loop, off the keyspace's loop: it reads only the keyspace's immutable fields.
func (m miss) record(note string) {
	k := m.k
	k.w.m.hotExpired.WithLabelValues(k.name).Inc()
	k.hotExpired.Add(1)
	if m.shortNotice {
		k.w.m.lateNotice.WithLabelValues(k.name).Inc()
	}
	args := []any{"id", m.id, "expiry", m.expiry, "since_expiry", m.since, "short_notice", m.shortNotice, "errors", m.errors}
	if note != "" {
		args = append(args, "note", note)
	}
	k.log.Warn("hot key missed: "+m.why, args...)
}

// claimKey is the Redis key of a miss's claim.
func (f *fleet) claimKey(m miss) string { return f.cfg.Key + ":missed:" + m.k.name + ":" + m.id }

// submit hands a miss to the claim loop; false when the loop is not running or its queue is full (then the
// caller counts it at once: a miss is never dropped).
func (f *fleet) submit(m miss) bool {
	if !f.claiming.Load() {
		return false
	}
	m.queued = time.Now()
	select {
	case f.claims <- m:
		return true
	default:
		return false
	}
}

// claimMisses runs the claims until ctx ends, batching what has queued into one pipeline of missclaim.lua
// calls per round; the claims left when ctx ends are counted unclaimed.
func (f *fleet) claimMisses(ctx context.Context) {
	f.claiming.Store(true)
	var pending []miss
	defer func() {
		f.claiming.Store(false)
		pending = drainClaims(f.claims, pending)
		for _, m := range pending {
			m.record("counted without a fleet claim: the warmer stopped")
		}
	}()
	retry := time.NewTimer(missClaimRetry)
	defer retry.Stop()
	for {
		if len(pending) == 0 {
			select {
			case <-ctx.Done():
				return
			case m := <-f.claims:
				pending = append(pending, m)
			}
		} else {
			select {
			case <-ctx.Done():
				return
			case m := <-f.claims:
				pending = append(pending, m)
			case <-retry.C:
			}
		}
		pending = f.claimOnce(ctx, drainClaims(f.claims, pending))
		if len(pending) > 0 {
			retry.Reset(missClaimRetry)
		}
	}
}

// drainClaims appends to pending every miss waiting in claims, without blocking.
func drainClaims(claims <-chan miss, pending []miss) []miss {
	for {
		select {
		case m := <-claims:
			pending = append(pending, m)
		default:
			return pending
		}
	}
}

// claimOnce runs one claim per pending miss and returns those Redis did not answer, counting the ones past
// missClaimGiveUp unclaimed.
func (f *fleet) claimOnce(ctx context.Context, pending []miss) []miss {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	window := 2 * f.cfg.HeartbeatTTL
	cmds := make([]*redis.Cmd, len(pending))
	// EVAL, not EVALSHA: a pipeline cannot fall back on NOSCRIPT, and claims are rare.
	_, _ = f.w.rdb.Pipelined(cctx, func(p redis.Pipeliner) error {
		for i, m := range pending {
			threshold := m.seen.Add(-window)
			switch {
			case !m.expiry.IsZero() && !m.learnedAt.IsZero():
				threshold = m.learnedAt.Add(-expiryTolerance)
			case !m.expiry.IsZero():
				threshold = m.expiry.Add(-expiryTolerance)
			}
			if !m.expiry.IsZero() && !m.after.IsZero() && !threshold.After(m.after) {
				// A value the daemon wrote is dated when its publish was sent: before the previous miss was
				// counted when that publish found the key gone (counted with its reply), or within the margin
				// after it when the batch's re-check found it gone and the origin answered at once. The previous
				// miss's claim (ours, or another replica's of the same earlier loss, which came first) then passed
				// for this value's loss, and the next miss of a key rebuilt so was only logged as counted already.
				threshold = m.after.Add(time.Millisecond)
			}
			cmds[i] = p.Eval(cctx, missClaimLua, []string{f.claimKey(m)}, threshold.UnixMilli(), m.seen.UnixMilli(),
				missClaimTTL.Milliseconds())
		}
		return nil
	})
	var left []miss
	for i, m := range pending {
		won, err := cmds[i].Int()
		switch {
		case err == nil && won == 1:
			m.record("")
		case err == nil:
			f.deduplicated.Inc()
			m.k.log.Info("hot key miss already counted by another replica", "id", m.id, "why", m.why,
				"claim", f.claimKey(m))
		case time.Since(m.queued) > missClaimGiveUp:
			m.record("counted without a fleet claim: Redis did not answer (" + err.Error() + ")")
		default:
			left = append(left, m)
		}
	}
	return left
}
