package lockstep

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// accessBuf holds sampled read counts between flushes.
type accessBuf struct {
	mu     sync.Mutex
	counts map[string]float64 // id → estimated reads (sum of 1/sampleRate)
	kick   chan struct{}      // asks the flusher for an early flush when the buffer is full
}

// recordAccess samples one read of id into the buffer. It never blocks on Redis.
func (c *Client) recordAccess(id string) {
	a := c.access
	if a == nil {
		return
	}
	rate := c.cfg.sampleRate
	if rate < 1 && c.cfg.rand() >= rate {
		return
	}
	a.mu.Lock()
	_, known := a.counts[id]
	full := len(a.counts) >= c.cfg.maxPending
	if known || !full {
		a.counts[id] += 1 / rate
	}
	a.mu.Unlock()
	if full {
		select {
		case a.kick <- struct{}{}:
		default:
		}
	}
}

func (c *Client) flushLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.flushInterval)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return // Close flushes the rest with its own context
		case <-t.C:
		case <-c.access.kick:
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.flushInterval+5*time.Second)
		if err := c.flushAccess(ctx); err != nil {
			c.log.Warn("lockstep: flush access counts; dropped them", "error", err)
		}
		cancel()
	}
}

// flushAccess sends the buffered counts with one pipelined ZINCRBY per id, in one round trip. Counts that fail
// to reach Redis are dropped: they are estimates.
func (c *Client) flushAccess(ctx context.Context) error {
	a := c.access
	a.mu.Lock()
	counts := a.counts
	if len(counts) == 0 {
		a.mu.Unlock()
		return nil
	}
	a.counts = make(map[string]float64, len(counts))
	a.mu.Unlock()
	err := c.call(ctx, func(ctx context.Context) error {
		_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for id, n := range counts {
				p.ZIncrBy(ctx, c.accessKey, n, id)
			}
			return nil
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("flush %d access counts to %q: %w", len(counts), c.accessKey, err)
	}
	return nil
}
