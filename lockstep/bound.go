package lockstep

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// honoursDeadlines reports whether rdb ends a blocked socket read when the command's context ends. go-redis does
// so only with ContextTimeoutEnabled; otherwise a read waits for ReadTimeout (5s by default), and with the default
// 3 retries a frozen Redis holds a call for tens of seconds. Unknown implementations are assumed not to.
func honoursDeadlines(rdb RedisClient) bool {
	switch r := rdb.(type) {
	case *redis.Client:
		return r.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return r.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return r.Options().ContextTimeoutEnabled
	}
	return false
}

// call runs f, one Redis round trip, with a context that ends after the Redis timeout (or earlier, with ctx), and
// returns f's error. When the bound ends first (or the socket read times out), the error wraps ErrRedisTimeout and
// context.DeadlineExceeded.
//
// When the client ignores context deadlines, f runs in a goroutine of its own and call returns at the bound
// without waiting for it; the caller must then not read the commands f made (it reads them only when call
// returns nil or a reply error such as redis.Nil). That goroutine ends when go-redis gives up by itself.
func (c *Client) call(ctx context.Context, f func(ctx context.Context) error) error {
	bctx, cancel := context.WithTimeout(ctx, c.cfg.redisTimeout)
	defer cancel()
	var err error
	if c.ctxAware {
		err = f(bctx)
	} else {
		done := make(chan error, 1)
		go func() { done <- f(bctx) }()
		select {
		case err = <-done:
		case <-bctx.Done():
			err = bctx.Err()
		}
	}
	if err != nil && ctx.Err() == nil && (errors.Is(bctx.Err(), context.DeadlineExceeded) || isTimeout(err)) {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w (bound %v): %w", ErrRedisTimeout, c.cfg.redisTimeout, err)
		}
		return fmt.Errorf("%w (bound %v): %w: %w", ErrRedisTimeout, c.cfg.redisTimeout, context.DeadlineExceeded, err)
	}
	return err
}

// isTimeout reports whether err is a network timeout: go-redis sets the socket deadline from the bound, and its
// read may fail an instant before the bound's context reports it.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// replyError reports whether err is an error reply of Redis (WRONGTYPE, NOSCRIPT, OOM...), as opposed to a
// timeout or a transport error after which the command may or may not have run.
func replyError(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, redis.Nil)
}

// Bounds of releaseLater.
const (
	releaseLaterFirst  = 20 * time.Millisecond // first retry
	releaseLaterMax    = time.Second           // longest sleep between retries
	releaseLaterMinAge = time.Minute           // gives up when Redis has not answered for max(this, 10 × lock TTL)
)

// releaseLater releases, in the background, the lock of ks taken with token by a SET NX (or released by a call)
// whose reply was lost to a timeout or a transport error. The command may have run, or may still run when a
// frozen Redis wakes and works through its queued input; the process would then hold a lock it does not know
// about, and every app's rebuild of the key would wait for the whole lock TTL. It retries the token-checked
// release (release.lua, so a lock of another token is never touched) with exponential back-off from 20ms up to
// 1s, until a release deletes the lock, or for one lock TTL after Redis first answers (a queued SET NX runs by
// then), or for max(1 minute, 10 × lock TTL) without an answer; Close stops it.
func (c *Client) releaseLater(ks KeySet, token string) {
	if !c.enter() {
		return
	}
	go func() {
		defer c.wg.Done()
		start := time.Now()
		giveUp := start.Add(max(releaseLaterMinAge, 10*c.cfg.lockTTL))
		var answered time.Time
		sleep := releaseLaterFirst
		timer := time.NewTimer(0)
		defer timer.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-timer.C:
			}
			var ok bool
			err := c.call(context.Background(), func(ctx context.Context) (err error) {
				ok, err = Release(ctx, c.rdb, ks.Lock, token)
				return err
			})
			now := time.Now()
			switch {
			case err == nil && ok:
				c.log.Debug("lockstep: released a lock taken by a call that timed out", "id", ks.ID,
					"after", now.Sub(start).String())
				return
			case err == nil:
				if answered.IsZero() {
					answered = now
				}
				if now.Sub(answered) >= c.cfg.lockTTL {
					return // not held, and any queued SET NX has run by now
				}
			case now.After(giveUp):
				c.log.Warn("lockstep: give up releasing a lock taken by a call that timed out; it expires by itself",
					"id", ks.ID, "error", err)
				return
			}
			timer.Reset(sleep)
			sleep = min(2*sleep, releaseLaterMax)
		}
	}()
}
