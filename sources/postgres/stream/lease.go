package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/lockstep"
)

// DefaultLeaseTTL is the stream lease's TTL: a standby takes over at most this long (plus one attempt period,
// DefaultLeaseTTL/5) after the holder died.
const DefaultLeaseTTL = 5 * time.Second

// Lease makes one daemon of a fleet the consumer of a replication slot (a slot has one consumer): the
// holder of a Redis lock, taken and renewed with the lockstep token protocol (SET NX PX, token-checked PEXPIRE
// and DEL), runs the stream; the others stand by and try to take the lease every TTL/5. The lease only decides who
// streams: every write still goes through the key's own lock.
type Lease struct {
	rdb   redis.UniversalClient
	key   string
	ttl   time.Duration
	token string
	log   *slog.Logger
	held  prometheus.Gauge
	takes prometheus.Counter

	mu    sync.Mutex
	state string
	since time.Time
}

// LeaseStatus is a Lease's state.
type LeaseStatus struct {
	Key   string    `json:"key"`
	State string    `json:"state"` // "holder", "standby", "stopped"
	Since time.Time `json:"since"`
}

// NewLease returns a lease on key (e.g. "keepwarm:stream:<slot>") with ttl (0: DefaultLeaseTTL). reg
// receives keepwarm_stream_lease_held and keepwarm_stream_lease_acquired_total (nil: none).
func NewLease(rdb redis.UniversalClient, key string, ttl time.Duration, log *slog.Logger, reg prometheus.Registerer) (*Lease, error) {
	if ttl <= 0 {
		ttl = DefaultLeaseTTL
	}
	if ttl < 100*time.Millisecond {
		return nil, fmt.Errorf("warmer: stream lease: ttl %v is under 100ms", ttl)
	}
	if log == nil {
		log = slog.Default()
	}
	l := &Lease{rdb: rdb, key: key, ttl: ttl, token: lockstep.NewToken(), log: log.With("lease", key),
		state: "stopped", since: time.Now(),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keepwarm_stream_lease_held",
			Help: "1 while this daemon holds the stream lease (and so streams from the slot), else 0.",
		}),
		takes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keepwarm_stream_lease_acquired_total",
			Help: "Times this daemon took the stream lease (start-up or takeover from a dead holder).",
		}),
	}
	if reg != nil {
		if err := errors.Join(reg.Register(l.held), reg.Register(l.takes)); err != nil {
			return nil, fmt.Errorf("warmer: stream lease: register metrics: %w", err)
		}
	}
	return l, nil
}

// Status returns the lease's state.
func (l *Lease) Status() LeaseStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	return LeaseStatus{Key: l.key, State: l.state, Since: l.since}
}

func (l *Lease) set(state string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != state {
		l.state, l.since = state, time.Now()
	}
	l.held.Set(b2f(state == "holder"))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Run runs fn while this daemon holds the lease, until ctx ends. fn's context ends when the lease is lost (a
// renewal found another token, or Redis did not answer for half the TTL, before the lease can expire); Run then waits for
// fn and stands by again. When ctx ends it waits for fn and releases the lease. It returns fn's error if fn
// fails while the lease is held and ctx is live (a configuration PostgreSQL refuses), else nil.
func (l *Lease) Run(ctx context.Context, fn func(ctx context.Context) error) error {
	defer l.set("stopped")
	l.set("standby")
	retry := l.ttl / 5
	for {
		ok, err := lockstep.Acquire(ctx, l.rdb, l.key, l.token, l.ttl)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			l.log.Warn("stream lease: Redis error; retrying", "error", err)
		}
		if ok {
			if err := l.hold(ctx, fn); err != nil {
				return err
			}
			if ctx.Err() != nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(retry):
		}
	}
}

// hold runs fn and renews the lease every ttl/4 until fn returns, the lease is lost, or ctx ends.
func (l *Lease) hold(ctx context.Context, fn func(ctx context.Context) error) error {
	l.takes.Inc()
	l.set("holder")
	l.log.Info("stream lease acquired: this daemon streams changes")
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- fn(fctx) }()
	t := time.NewTicker(l.ttl / 4)
	defer t.Stop()
	good := time.Now()
	var fnErr error
	finished := false
loop:
	for {
		select {
		case fnErr = <-done:
			finished = true
			break loop
		case <-ctx.Done():
			break loop
		case <-t.C:
			sent := time.Now()
			ok, err := lockstep.Extend(ctx, l.rdb, l.key, l.token, l.ttl)
			switch {
			case err == nil && ok:
				good = sent
			case err == nil:
				l.log.Warn("stream lease lost to another daemon; standing by")
				break loop
			case time.Since(good) > l.ttl/2:
				// Give up well before the lease can expire, so that a standby never streams alongside.
				l.log.Warn("stream lease: Redis did not answer; it may have expired; standing by", "error", err)
				break loop
			}
		}
	}
	cancel()
	if !finished {
		fnErr = <-done
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	_, _ = lockstep.Release(rctx, l.rdb, l.key, l.token)
	rcancel()
	l.set("standby")
	if ctx.Err() != nil {
		return nil
	}
	return fnErr
}
