package warmer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/warmer/internal/mailbox"
)

// What a change to a feeding table does to a keyspace's keys (ChangeKeyspace.OnChange).
const (
	// OnChangeRefresh rebuilds the changed ids' keys now, under the lock, through the refresh pipeline: only ids
	// whose key is hot, cached, or being rebuilt (its lock exists); ids not cached are left alone.
	OnChangeRefresh = "refresh"
	// OnChangeInvalidate deletes the changed ids' cache keys, meta hashes and locks (lockstep.Invalidate), so
	// that a rebuild in flight cannot publish the old row; the next read rebuilds.
	OnChangeInvalidate = "invalidate"
)

// Defaults of ChangesConfig.
const (
	// DefaultVisibilityTimeout bounds the wait for a batch's commits to become visible before its changes are
	// refreshed (ChangesConfig.VisibilityTimeout).
	DefaultVisibilityTimeout = 10 * time.Second
	// DefaultFreshness is the freshness SLO's bound (ChangesConfig.Freshness).
	DefaultFreshness = time.Second
)

// Feed says that changes to a table change a keyspace's ids: the id is the value of Column in the changed row.
// An UPDATE that moves a row from one id to another (track.album_id 1 → 2) changes both ids, which needs the old
// row: REPLICA IDENTITY FULL on the table unless Column is part of its replica identity (docs/operations.md).
type Feed struct {
	Table  string // "schema.table", as the stream reports it
	Column string // the column holding the keyspace's id
}

// ChangeKeyspace is one keyspace fed by the change stream.
type ChangeKeyspace struct {
	Keyspace string
	OnChange string // OnChangeRefresh (default) or OnChangeInvalidate
	Feeds    []Feed
}

// RowChange is one changed row of a feeding table: its columns as text (non-NULL values only), before (Old:
// DELETE, and UPDATE when the server sent it) and after (New: INSERT, UPDATE).
type RowChange struct {
	Table    string
	Old, New map[string]string
}

// Txn is one committed transaction's row changes.
type Txn struct {
	LSN     uint64    // the LSN just past its commit record: a replica that replayed it sees the change
	Xid     uint32    // its transaction id, for VisibilityWaiter (0: not known, not waited for)
	Commit  time.Time // commit time on the origin's clock, for the commit-to-Redis latency
	Changes []RowChange
}

// VisibilityWaiter is implemented by a Source that can tell when committed transactions are visible to its
// queries (postgres.Source): WaitVisible returns once every transaction xids[i], whose commit record ends at
// ends[i], is visible on the server the source reads from, with the last time each was seen not visible (zero:
// visible at the first look), or ctx's error. A change is refreshed only after it: a refresh that reads the row
// before the commit is visible writes the old row and acknowledges the change.
type VisibilityWaiter interface {
	WaitVisible(ctx context.Context, xids []uint32, ends []uint64) ([]time.Time, error)
}

// ChangesConfig configures Changes.
type ChangesConfig struct {
	Keyspaces []ChangeKeyspace
	// VisibilityTimeout bounds the wait for a batch's commits to become visible on the server a keyspace reads
	// (VisibilityWaiter: released by a synchronous standby on a primary, replayed on a replica); on timeout the
	// batch fails and is retried, not acknowledged (counted in keepwarm_changes_visibility_timeouts_total).
	// Default DefaultVisibilityTimeout.
	VisibilityTimeout time.Duration
	// Freshness is the freshness SLO's bound: a changed key published (or invalidated) more than Freshness after
	// its commit became visible is counted late (keepwarm_changes_late_total, keepwarm_changes_stale_seconds_total).
	// Default DefaultFreshness.
	Freshness time.Duration
	// Registerer receives the metrics (nil: none); Logger defaults to the Warmer's.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Changes applies committed row changes from a change stream to the Warmer's keyspaces: each changed row is
// mapped to ids by the keyspaces' Feeds, the ids of one batch are coalesced, and each keyspace refreshes (or
// invalidates) them. Refreshes run through the same pipeline as refresh-ahead (lock, one query per batch,
// token-checked publish, release) and share its origin budget.
//
// A refresh must not lose to a rebuild that read the row before the commit. So before locking, Changes deletes
// the ids' locks (the revocation of lockstep.Invalidate, Nishtala et al., NSDI 2013), which makes such a rebuild's
// publish fail its token check, and then rebuilds under its own lock. Whoever takes a lock after the deletion
// read the row after the commit. Apply returns nil only once every id is published, so that the stream
// acknowledges the LSN only then (at-least-once; refreshes are idempotent).
type Changes struct {
	w   *Warmer
	cfg ChangesConfig
	log *slog.Logger
	m   *changeMetrics

	mu     sync.Mutex
	byTbl  map[string][]feedOf // table → feeds
	spaces []ChangeKeyspace

	// unseen remembers, across the retries of a batch, the last time each of its transactions was seen not
	// visible by a keyspace's source: a retry that finds it visible at once must not date its visibility back to
	// the commit. Entries go when their batch is applied (and all at once past maxUnseen, after a reset).
	unseenMu sync.Mutex
	unseen   map[unseenKey]time.Time
}

// maxUnseen bounds Changes.unseen: entries of batches never applied (a slot recreated meanwhile) do not pile up.
const maxUnseen = 100_000

type unseenKey struct {
	keyspace string
	xid      uint32
	lsn      uint64
}

type feedOf struct {
	keyspace string
	column   string
}

// NewChanges validates cfg against w's keyspaces and returns Changes. Errors name the keyspace and field.
func NewChanges(w *Warmer, cfg ChangesConfig) (*Changes, error) {
	if cfg.VisibilityTimeout <= 0 {
		cfg.VisibilityTimeout = DefaultVisibilityTimeout
	}
	if cfg.Freshness <= 0 {
		cfg.Freshness = DefaultFreshness
	}
	if cfg.Logger == nil {
		cfg.Logger = w.log
	}
	m, err := newChangeMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("warmer: changes: register metrics: %w", err)
	}
	c := &Changes{w: w, cfg: cfg, log: cfg.Logger, m: m, unseen: map[unseenKey]time.Time{}}
	if err := c.Update(cfg.Keyspaces); err != nil {
		return nil, err
	}
	return c, nil
}

// Update replaces the fed keyspaces (a config reload). It checks them first and changes nothing on error.
func (c *Changes) Update(spaces []ChangeKeyspace) error {
	var errs []error
	by := map[string][]feedOf{}
	out := make([]ChangeKeyspace, 0, len(spaces))
	for _, s := range spaces {
		if s.OnChange == "" {
			s.OnChange = OnChangeRefresh
		}
		if s.OnChange != OnChangeRefresh && s.OnChange != OnChangeInvalidate {
			errs = append(errs, fmt.Errorf("keyspace %q: on_change: %q is not %q or %q", s.Keyspace, s.OnChange,
				OnChangeRefresh, OnChangeInvalidate))
		}
		if c.w.keyspace(s.Keyspace) == nil {
			errs = append(errs, fmt.Errorf("keyspace %q: unknown keyspace", s.Keyspace))
		}
		for i, f := range s.Feeds {
			if f.Table == "" || f.Column == "" {
				errs = append(errs, fmt.Errorf("keyspace %q: fed_by[%d]: table and id column are required", s.Keyspace, i))
				continue
			}
			by[f.Table] = append(by[f.Table], feedOf{keyspace: s.Keyspace, column: f.Column})
		}
		out = append(out, s)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("warmer: changes: %w", err)
	}
	c.mu.Lock()
	c.byTbl, c.spaces = by, out
	c.mu.Unlock()
	return nil
}

// Tables returns the feeding tables, sorted.
func (c *Changes) Tables() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.byTbl))
	for t := range c.byTbl {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// IDs maps txns to the changed ids of each fed keyspace, deduplicated, in first-seen order. A row's old and new
// values of the id column both count (an UPDATE that moves it changes both ids).
func (c *Changes) IDs(txns []Txn) map[string][]string { return c.changed(txns).ids }

// changedIDs is what a batch of transactions changes, per fed keyspace.
type changedIDs struct {
	ids   map[string][]string       // keyspace → changed ids, in first-seen order
	first map[string]map[string]int // keyspace → id → index of the first transaction that changed it
	txns  map[string][]int          // keyspace → indexes of the transactions that changed it, ascending
}

func (c *Changes) changed(txns []Txn) changedIDs {
	c.mu.Lock()
	by := c.byTbl
	c.mu.Unlock()
	out := changedIDs{ids: map[string][]string{}, first: map[string]map[string]int{}, txns: map[string][]int{}}
	add := func(ks, id string, t int) {
		f := out.first[ks]
		if f == nil {
			f = map[string]int{}
			out.first[ks] = f
		}
		if tx := out.txns[ks]; len(tx) == 0 || tx[len(tx)-1] != t {
			out.txns[ks] = append(tx, t)
		}
		if _, ok := f[id]; !ok {
			f[id] = t
			out.ids[ks] = append(out.ids[ks], id)
		}
	}
	for t, txn := range txns {
		for _, ch := range txn.Changes {
			for _, f := range by[ch.Table] {
				if v, ok := ch.Old[f.column]; ok {
					add(f.keyspace, v, t)
				}
				if v, ok := ch.New[f.column]; ok {
					add(f.keyspace, v, t)
				}
			}
		}
	}
	return out
}

// Apply applies a batch of committed transactions, in commit order, and returns nil once every changed id of
// every fed keyspace is published (or invalidated, or known not cached). Each keyspace first waits, at most
// VisibilityTimeout, until the transactions that changed it are visible on the server it reads from
// (VisibilityWaiter), so that no refresh reads a row from before the commit. It returns an error when anything
// failed (origin, Redis, a commit that did not become visible in time); the caller retries the batch and does not
// acknowledge it meanwhile.
func (c *Changes) Apply(ctx context.Context, txns []Txn) error {
	if len(txns) == 0 {
		return nil
	}
	ch := c.changed(txns)
	n := 0
	for _, t := range txns {
		n += len(t.Changes)
	}
	c.m.rows.Add(float64(n))
	visible, err := c.applyIDs(ctx, ch, txns)
	if err != nil {
		return err
	}
	c.forgetUnseen(txns)
	now := time.Now()
	for i, t := range txns {
		c.m.commitToRedis.Observe(max(now.Sub(t.Commit), 0).Seconds())
		c.m.visibleToRedis.Observe(max(now.Sub(visibleBound(t, visible[i])), 0).Seconds())
	}
	c.m.txns.Add(float64(len(txns)))
	return nil
}

// visibleBound is a lower bound of the moment a transaction became visible: its commit time, or the last time it
// was seen not visible when that is later.
func visibleBound(t Txn, lastInvisible time.Time) time.Time {
	if lastInvisible.After(t.Commit) {
		return lastInvisible
	}
	return t.Commit
}

// Resync makes the fed keyspaces consistent again after the stream could not deliver some changes: it refreshes
// every hot key of every fed keyspace once, through the same path as a change, and then, unless reason is
// ResyncCreated (a first start: nothing was missed that keepwarm was following), invalidates every other cached
// key of them (invalidateCold), since any of them may hold a row changed meanwhile. It first waits for each
// keyspace's first poll of its hot-key signals (the warmer must be running), so that a resync at start-up sees
// the hot set; it returns ctx's error if ctx ends first.
func (c *Changes) Resync(ctx context.Context, reason string) error {
	c.mu.Lock()
	spaces := slices.Clone(c.spaces)
	c.mu.Unlock()
	ids := map[string][]string{}
	total := 0
	for _, s := range spaces {
		k := c.w.keyspace(s.Keyspace)
		if k == nil {
			continue
		}
		// A resync at start-up (a slot created or lost while the daemon was down) runs alongside the warmer's
		// first poll: taken before it, the hot set is empty and the resync covers nothing.
		select {
		case <-k.polled:
		case <-ctx.Done():
			return ctx.Err()
		}
		hot, err := mailbox.Call(ctx, k.mail, func(k *loopState) []string {
			hot := make([]string, 0, len(k.hotSet))
			for id := range k.hotSet {
				hot = append(hot, id)
			}
			return hot
		})
		if err != nil {
			return err
		}
		ids[s.Keyspace] = hot
		total += len(ids[s.Keyspace])
	}
	cold := reason != ResyncCreated
	if cold {
		c.log.Warn("resync: refreshing every hot key of the fed keyspaces, then invalidating every other cached key of them",
			"reason", reason, "hot_keys", total)
	} else {
		c.log.Warn("resync of a new replication slot: refreshing every hot key of the fed keyspaces once",
			"reason", reason, "hot_keys", total)
	}
	if _, err := c.applyIDs(ctx, changedIDs{ids: ids}, nil); err != nil {
		return err
	}
	c.m.resyncKeys.Add(float64(total))
	if !cold {
		return nil
	}
	for _, s := range spaces {
		if k := c.w.keyspace(s.Keyspace); k != nil {
			if err := c.invalidateCold(ctx, k); err != nil {
				return err
			}
		}
	}
	return nil
}

// Resync reasons the warmer tells apart (the change stream's, sources/postgres).
const (
	// ResyncTruncate is a TRUNCATE of a feeding table: every cached key of the fed keyspaces is known wrong.
	ResyncTruncate = "truncate"
	// ResyncCreated is a replication slot created where none was ever streamed from: a first start, which
	// missed nothing keepwarm was following; only hot keys are refreshed.
	ResyncCreated = "created"
)

// truncateScanRate bounds the cold keys a resync invalidates per second, so that a keyspace of
// millions of cached keys does not monopolise Redis: 20,000/s, in SCAN pages of 1,000.
const (
	truncateScanRate  = 20000
	truncateScanCount = 1000
)

// invalidateCold invalidates (lockstep.Invalidate) every cached key of k that is not hot, found with SCAN of its
// key template on every master, at most truncateScanRate keys a second. Hot keys were just refreshed. It logs how
// many it invalidated.
func (c *Changes) invalidateCold(ctx context.Context, k *keyspace) error {
	if k.match == nil {
		return nil // a template without exactly one ${id}: its keys cannot be told apart from others'
	}
	lim := rate.NewLimiter(truncateScanRate, truncateScanCount)
	var n int
	scan := func(ctx context.Context, rdb redis.Cmdable) error {
		var cursor uint64
		for {
			keys, next, err := rdb.Scan(ctx, cursor, k.match.pattern(), truncateScanCount).Result()
			if err != nil {
				return fmt.Errorf("scan %s: %w", k.match.pattern(), err)
			}
			var ids []string
			for _, key := range keys {
				if id, ok := k.match.id(key); ok {
					ids = append(ids, id)
				}
			}
			ids, err = mailbox.Call(ctx, k.mail, func(k *loopState) []string {
				return slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return k.hotSet[id] != nil })
			})
			if err != nil {
				return err
			}
			for len(ids) > 0 { // SCAN's COUNT is a hint: a page can hold more than the limiter's burst
				chunk := ids[:min(len(ids), truncateScanCount)]
				if err := lim.WaitN(ctx, len(chunk)); err != nil {
					return err
				}
				if _, err := c.invalidate(ctx, k, chunk); err != nil {
					return err
				}
				n += len(chunk)
				ids = ids[len(chunk):]
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	var err error
	if cc, ok := c.w.rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		err = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			mu.Lock() // one master at a time: n and the limiter are shared
			defer mu.Unlock()
			return scan(ctx, m)
		})
	} else {
		err = scan(ctx, c.w.rdb)
	}
	if err != nil {
		return fmt.Errorf("keyspace %q: invalidate cold keys after a resync: %w", k.name, err)
	}
	c.log.Warn("resync: cold cached keys invalidated", "keyspace", k.name, "keys", n)
	return nil
}

// applyIDs refreshes or invalidates the changed ids per keyspace, the keyspaces in parallel. With txns (nil for a
// resync), each keyspace first waits for the transactions that changed it to be visible (waitVisible), and counts
// the changed keys it published later than Freshness after that (the freshness SLO). It returns, per transaction,
// the last time any keyspace saw it not visible.
func (c *Changes) applyIDs(ctx context.Context, ch changedIDs, txns []Txn) ([]time.Time, error) {
	c.mu.Lock()
	spaces := slices.Clone(c.spaces)
	c.mu.Unlock()
	var wg sync.WaitGroup
	errs := make([]error, len(spaces))
	seen := make([][]time.Time, len(spaces)) // per keyspace: per transaction, last seen not visible
	for i, s := range spaces {
		list := ch.ids[s.Keyspace]
		k := c.w.keyspace(s.Keyspace)
		if len(list) == 0 || k == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if txns != nil {
				seen[i], err = c.waitVisible(ctx, k, txns, ch.txns[s.Keyspace])
			}
			var done []string
			if err == nil {
				if s.OnChange == OnChangeInvalidate {
					done, err = c.invalidate(ctx, k, list)
				} else {
					done, err = c.refresh(ctx, k, list)
				}
			}
			if err != nil {
				errs[i] = fmt.Errorf("keyspace %q: %w", s.Keyspace, err)
				return
			}
			if txns != nil {
				c.noteFreshness(k.name, done, ch.first[s.Keyspace], txns, seen[i], time.Now())
			}
		}()
	}
	wg.Wait()
	out := make([]time.Time, len(txns))
	for _, per := range seen {
		for t, at := range per {
			if at.After(out[t]) {
				out[t] = at
			}
		}
	}
	return out, errors.Join(errs...)
}

// waitVisible waits, at most VisibilityTimeout, until the transactions txns[idx] are visible on the server k's
// source reads from (VisibilityWaiter; a source that is not one is taken to read the primary directly after the
// commit). It returns, per transaction of txns, the last time it was seen not visible.
func (c *Changes) waitVisible(ctx context.Context, k *keyspace, txns []Txn, idx []int) ([]time.Time, error) {
	out := make([]time.Time, len(txns))
	vw, ok := k.config().Src.(VisibilityWaiter)
	if !ok {
		return out, nil
	}
	xids := make([]uint32, 0, len(idx))
	ends := make([]uint64, 0, len(idx))
	var asked []int
	for _, t := range idx {
		if txns[t].Xid != 0 {
			xids, ends, asked = append(xids, txns[t].Xid), append(ends, txns[t].LSN), append(asked, t)
		}
	}
	if len(xids) == 0 {
		return out, nil
	}
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, c.cfg.VisibilityTimeout)
	last, err := vw.WaitVisible(wctx, xids, ends)
	cancel()
	c.m.visibleWait.WithLabelValues(k.name).Observe(time.Since(start).Seconds())
	c.unseenMu.Lock()
	if len(c.unseen) > maxUnseen {
		clear(c.unseen)
	}
	for j, t := range asked {
		key := unseenKey{k.name, xids[j], ends[j]}
		at := c.unseen[key]
		if j < len(last) && last[j].After(at) {
			at = last[j]
		}
		if !at.IsZero() {
			c.unseen[key] = at
		}
		out[t] = at
	}
	c.unseenMu.Unlock()
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			c.m.visibleTimeout.WithLabelValues(k.name).Inc()
			return out, fmt.Errorf("%d commits (last LSN %X/%X) not visible within visibility_timeout %v (a synchronous standby not confirming, or a replica behind): %w",
				len(xids), ends[len(ends)-1]>>32, uint32(ends[len(ends)-1]), c.cfg.VisibilityTimeout, err)
		}
		return out, fmt.Errorf("wait for commits to be visible: %w", err)
	}
	return out, nil
}

// forgetUnseen drops what waitVisible remembered of txns, once they are applied.
func (c *Changes) forgetUnseen(txns []Txn) {
	c.unseenMu.Lock()
	defer c.unseenMu.Unlock()
	if len(c.unseen) == 0 {
		return
	}
	c.mu.Lock()
	spaces := slices.Clone(c.spaces)
	c.mu.Unlock()
	for _, t := range txns {
		for _, s := range spaces {
			delete(c.unseen, unseenKey{s.Keyspace, t.Xid, t.LSN})
		}
	}
}

// noteFreshness counts the keys of keyspace ks that a batch published (or invalidated) at published more than
// Freshness after the first transaction that changed them became visible (visibleBound: never earlier than it
// really did, so a late key is never missed; a change delivered again after a crash counts again).
func (c *Changes) noteFreshness(ks string, done []string, first map[string]int, txns []Txn, seen []time.Time, published time.Time) {
	var late, stale float64
	for _, id := range done {
		t, ok := first[id]
		if !ok {
			continue
		}
		var last time.Time
		if t < len(seen) {
			last = seen[t]
		}
		if age := published.Sub(visibleBound(txns[t], last)); age > c.cfg.Freshness {
			late++
			stale += age.Seconds()
		}
	}
	if late > 0 {
		c.m.late.WithLabelValues(ks).Add(late)
		c.m.staleSeconds.WithLabelValues(ks).Add(stale)
	}
}

// invalidate deletes the keys, meta hashes and locks of ids (lockstep.Invalidate), pipelined, and returns the ids
// it invalidated.
func (c *Changes) invalidate(ctx context.Context, k *keyspace, ids []string) ([]string, error) {
	cfg := k.config()
	sets := make([]lockstep.KeySet, 0, len(ids))
	done := make([]string, 0, len(ids))
	for _, id := range ids {
		ks, err := cfg.Keys.For(id)
		if err != nil {
			c.m.applied.WithLabelValues(k.name, ChangeInvalidID).Inc()
			continue
		}
		sets, done = append(sets, ks), append(done, id)
	}
	if err := c.dropKeys(ctx, sets); err != nil {
		return nil, err
	}
	c.m.applied.WithLabelValues(k.name, ChangeInvalidated).Add(float64(len(sets)))
	return done, nil
}

// dropKeys deletes the keys, meta hashes and locks of sets (lockstep.Invalidate), pipelined, without counting.
func (c *Changes) dropKeys(ctx context.Context, sets []lockstep.KeySet) error {
	if len(sets) == 0 {
		return nil
	}
	_, err := c.w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, ks := range sets {
			if err := lockstep.Invalidate(ctx, p, ks); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("invalidate: %w", err)
	}
	return nil
}

// maxRevokeRounds bounds how often one batch re-runs ids whose lock was revoked again under it (another change,
// or an app's invalidation, in the same moment) before it gives up and lets the stream retry the batch.
const maxRevokeRounds = 5

// refresh rebuilds the ids of k that are hot, cached or being rebuilt, after revoking their locks, and returns
// the ids whose key it published (written, or the missing policy applied) or invalidated.
func (c *Changes) refresh(ctx context.Context, k *keyspace, ids []string) ([]string, error) {
	cfg := k.config()
	items, invalid := warmItems(cfg, ids)
	if len(invalid) > 0 {
		c.m.applied.WithLabelValues(k.name, ChangeInvalidID).Add(float64(len(invalid)))
		k.skipInvalid(ctx, cfg, sourceChanges, slices.Collect(maps.Keys(invalid)))
	}
	items, err := c.revoke(ctx, k, items)
	if err != nil {
		return nil, err
	}
	var done []string
	for round := 0; len(items) > 0; round++ {
		if round == maxRevokeRounds {
			return nil, fmt.Errorf("%d keys lost their lock %d times in a row", len(items), maxRevokeRounds)
		}
		var again []*item
		for start := 0; start < len(items); start += cfg.BatchSize {
			batch := items[start:min(start+cfg.BatchSize, len(items))]
			redo, published, err := c.refreshBatch(ctx, k, cfg, batch)
			if err != nil {
				return nil, err
			}
			again = append(again, redo...)
			done = append(done, published...)
		}
		items = again
	}
	return done, nil
}

// revoke deletes the locks of items, and returns those worth refreshing: hot, cached (EXISTS), or with a lock
// that was just deleted (a rebuild was in flight, maybe with the old row). One pipelined round trip.
func (c *Changes) revoke(ctx context.Context, k *keyspace, items []*item) ([]*item, error) {
	exists := make([]*redis.IntCmd, len(items))
	dels := make([]*redis.IntCmd, len(items))
	_, err := c.w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, it := range items {
			exists[i] = p.Exists(ctx, it.ks.Cache)
			dels[i] = p.Del(ctx, it.ks.Lock)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("revoke locks: %w", err)
	}
	return mailbox.Call(ctx, k.mail, func(k *loopState) []*item {
		var out []*item
		for i, it := range items {
			_, hot := k.hotSet[it.id]
			if hot || exists[i].Val() > 0 || dels[i].Val() > 0 {
				out = append(out, it)
				continue
			}
			c.m.applied.WithLabelValues(k.name, ChangeNotCached).Inc()
		}
		return out
	})
}

// refreshBatch runs one batch through the pipeline and returns the items to run again (lock revoked under it) and
// the ids whose key it published or invalidated.
func (c *Changes) refreshBatch(ctx context.Context, k *keyspace, cfg KeyspaceConfig, batch []*item) (again []*item, done []string, err error) {
	if err := k.slots.acquire(ctx); err != nil {
		return nil, nil, err
	}
	p := k.newPipeline(cfg, k.jitteredTTL(cfg))
	err = p.run(ctx, batch)
	k.slots.release()
	k.poke() // a refresh batch may be waiting for the slot
	if err != nil {
		return nil, nil, err
	}
	var large []*item
	var bad []lockstep.KeySet
	var failed error
	for _, it := range batch {
		switch it.result {
		case ResultOK, ResultMissing:
			c.m.applied.WithLabelValues(k.name, it.result).Inc()
			done = append(done, it.id)
		case ResultLocked:
			// Taken after the revocation: that rebuild reads the committed row.
			c.m.applied.WithLabelValues(k.name, ResultLocked).Inc()
		case ResultLockLost, ResultLockGone:
			again = append(again, it.reset())
		case ResultTooLarge:
			large = append(large, it)
		case ResultError:
			if it.reason == ReasonBadInput {
				// The origin query fails on this id alone (the pipeline split the batch and wrote the others):
				// retrying the change would fail the same way, forever. The cached value is stale: drop it.
				c.m.applied.WithLabelValues(k.name, ChangeInvalidID).Inc()
				bad = append(bad, it.ks)
				done = append(done, it.id)
				continue
			}
			if failed == nil {
				failed = fmt.Errorf("refresh %q: %w", it.ks.Cache, it.err)
			}
		default:
			if failed == nil {
				failed = fmt.Errorf("refresh %q: %w", it.ks.Cache, it.err)
			}
		}
	}
	if failed != nil {
		return nil, nil, failed
	}
	if len(large) > 0 {
		// The old value is known to be stale and the new one may not be written: drop it.
		sets := make([]lockstep.KeySet, len(large))
		for i, it := range large {
			sets[i] = it.ks
			c.log.Warn("changed value exceeds max_value_bytes; invalidating the key", "key", it.ks.Cache, "error", it.err)
		}
		dropped, err := c.invalidate(ctx, k, idsOf(large))
		if err != nil {
			return nil, nil, err
		}
		done = append(done, dropped...)
	}
	if err := c.dropKeys(ctx, bad); err != nil {
		return nil, nil, err
	}
	c.noteRefreshed(k, p, batch)
	return again, done, nil
}

func idsOf(items []*item) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.id
	}
	return out
}

// reset clears an item's outcome for another run through the pipeline.
func (it *item) reset() *item {
	return &item{id: it.id, ks: it.ks}
}

// noteRefreshed tells the scheduler the new expiry of hot keys that a change refreshed, so that refresh-ahead
// does not rebuild them again before their new TTL runs down.
func (c *Changes) noteRefreshed(k *keyspace, p *pipeline, batch []*item) {
	k.mail.Send(func(k *loopState) { noteRefreshedOn(k, p, batch) })
}

// noteRefreshedOn is noteRefreshed's message, on k's loop. The value each publish replaced is judged as a
// refresh's is (settleOne): found gone, or someone's rebuild after the known expiry, the key was missed. And the
// new value re-arms the count. Before, a change's publish only moved the expiry on: the miss it found was never
// judged, and a key whose earlier miss was counted stayed counted, so its next expiry was not (a soak: hot albums
// missing 1.3–1.6 s after a PostgreSQL outage, while the stream caught up, logged by no replica).
func noteRefreshedOn(k *loopState, p *pipeline, batch []*item) {
	for _, it := range batch {
		if it.result != ResultOK {
			continue
		}
		h := k.hotSet[it.id]
		if h == nil || h.inflight || h.persistent {
			continue
		}
		if k.owns(h.id) {
			if !it.prevUnknown {
				k.judgeReplaced(h, p.start, it.prevTTL)
			}
		}
		h.counted, h.invalidated, h.shortNotice = false, false, false
		h.expiry, h.learnedAt = p.start.Add(it.ttl), p.start
		h.lastRefresh = p.start
		h.needPTTL = false
		h.missing = false
		k.schedule(h)
	}
}
