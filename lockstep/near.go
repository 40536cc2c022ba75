package lockstep

import (
	"bytes"
	"container/heap"
	"container/list"
	"context"
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultNearMaxLag is the default NearCache.MaxLag: how late the invalidation connection may be before the near
// cache is emptied and bypassed.
const DefaultNearMaxLag = 500 * time.Millisecond

// ErrNearUnsupported is wrapped by New's error when WithNearCache is given a set-up it cannot keep coherent; the
// message says which and why.
var ErrNearUnsupported = errors.New("lockstep: near cache unsupported")

// minNearMaxLag is the smallest NearCache.MaxLag: the heartbeat runs every MaxLag/2.
const minNearMaxLag = 10 * time.Millisecond

// nearShards is the number of independently locked parts of a near cache; each holds at most MaxBytes/nearShards.
const nearShards = 16

// nearEntryOverhead is the bytes counted per held value beside its key and value: the map slot, the list element
// and the entry struct (measured on amd64, rounded up).
const nearEntryOverhead = 160

// NearCache configures a Client's near cache (WithNearCache): hot values held in the process's memory and served
// without a Redis round trip, kept coherent by Redis's client-side caching invalidation in broadcast mode
// (https://redis.io/docs/latest/develop/reference/client-side-caching/, "broadcasting mode"): the Client keeps
// one dedicated connection of its own (a go-redis client cloned from the app's options, speaking RESP2) that runs
// CLIENT TRACKING ON REDIRECT <its own id> BCAST PREFIX <the cache template's literal prefix> and is subscribed to
// __redis__:invalidate, so Redis tells it of every change of a key under the prefix, by any writer (keepwarm's
// daemon, another app, a DEL, an expiry, a FLUSHDB or FLUSHALL).
type NearCache struct {
	// MaxBytes bounds the memory held, in bytes, > 0: each value counts its key, its bytes and about 160 bytes of
	// bookkeeping. The cache has 16 parts, each with a sixteenth of MaxBytes; a value larger than that is never
	// held, and a full part drops its least recently read values.
	MaxBytes int64
	// MaxStaleness is the hard bound on a held value's age, > 0, by the Client's clock (WithClock): a value is
	// served from memory at most MaxStaleness after the read that fetched it began (and never past the key's
	// Redis TTL as that read saw it), whatever happens to invalidation. Seconds are typical.
	MaxStaleness time.Duration
	// MaxLag is how long the invalidation connection may go without a message or an answer to its heartbeat (a
	// PING every MaxLag/2) before it counts as down: the near cache is then emptied and bypassed, and a new
	// connection is made. Default DefaultNearMaxLag (500ms); 0 takes the default; at least 10ms, or New returns an error.
	MaxLag time.Duration
	// NoRefetch turns off the background refetch. By default one goroutine per Client reads a key again (GET and
	// PTTL, under the same rules as a fill) when an invalidation drops a value that was served from memory since
	// it was fetched, and when the last fifth of the life in memory of such a value begins (its deadline,
	// start + min(MaxStaleness, PTTL)): the next reads find the value in memory instead of each instance's first
	// reader paying a Redis round trip after every change and every MaxStaleness. This is refresh-ahead for the
	// memory tier, and what keeps hot-read p99 at memory speed. It costs one GET per Client per change of such a
	// key and per MaxStaleness, which those reads would otherwise have made themselves. At most 1,024 keys wait;
	// more are dropped (the next read fetches them).
	NoRefetch bool
}

// nearRefetchQueue bounds the keys waiting for a refetch (NearCache.NoRefetch).
const nearRefetchQueue = 1024

// WithNearCache turns on the near cache (off by default). A Get first looks in memory; a value is held there only
// while the invalidation connection is up, is dropped as soon as Redis's invalidation of its key reaches the Client,
// and is never served past n.MaxStaleness. While the connection is down or late (n.MaxLag) every Get reads Redis
// (a bypass) and nothing is held; go-redis redials at once, then the Client retries with a back-off (50ms doubling
// to 1s) until it is back. A read served from memory still counts as a Hit and is still sampled for access
// recording (WithAccessRecording), so keepwarm's heat sees it.
//
// The dedicated connection is made by a *redis.Client of the near cache's own, built from a copy of rdb's
// Options: the same address, database, Username and Password or CredentialsProvider(Context), TLSConfig and
// Dialer, and rdb's OnConnect (run first), but Protocol 2 and one connection. Hooks added to rdb with AddHook do not
// see it.
//
// The dedicated connection must be on the server the app's client reaches: on every new connection, and at
// every heartbeat, the app's client PUBLISHes an empty message to a channel that only the dedicated connection
// subscribes to (__lockstep:near:probe:<token>), and no receiver means that it is on another server (after a
// Sentinel failover, or when a proxy or DNS name moved the app's connections): the near cache is emptied and
// bypassed until a new dedicated connection passes the probe. So rdb may be a Sentinel failover client
// (redis.NewFailoverClient): the copied Dialer reaches the current master, and after a failover a value is served
// at most about MaxLag/2 after the app's client has moved to the new master. The app's ACL user needs PUBLISH.
// A ReplicaOnly failover client reads from replicas that the dedicated connection does not follow: its near cache
// stays bypassed, with a warning.
//
// New refuses the near cache, with an error wrapping ErrNearUnsupported, when rdb is not a *redis.Client (a
// Cluster client or a Ring: tracking is per node, and one connection sees one node's changes only), when it takes
// credentials from a StreamingCredentialsProvider (go-redis re-authenticates live connections with AUTH, and Redis refuses AUTH on a
// subscribed RESP2 connection), or with WithXFetch (XFetch decides on reads that reach Redis; near hits would hide
// them). The app's connection protocol (RESP2 or RESP3) and database do not matter: broadcast tracking names keys
// without their database, so a change of the same key name in another database also invalidates (harmless).
// Invalid fields wrap ErrInvalidArgument.
func WithNearCache(n NearCache) Option {
	return func(c *config) error {
		var errs []error
		if n.MaxBytes <= 0 {
			errs = append(errs, argError("near cache: max bytes", "%d is not > 0", n.MaxBytes))
		}
		if n.MaxStaleness <= 0 {
			errs = append(errs, argError("near cache: max staleness", "%v is not > 0", n.MaxStaleness))
		}
		if n.MaxLag < 0 || (n.MaxLag > 0 && n.MaxLag < minNearMaxLag) {
			errs = append(errs, argError("near cache: max lag", "%v is below %v", n.MaxLag, minNearMaxLag))
		}
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		if n.MaxLag == 0 {
			n.MaxLag = DefaultNearMaxLag
		}
		c.near = &n
		return nil
	}
}

// NearRecorder is the part of a Recorder that reports on the near cache (WithNearCache). A Client calls it when
// its Recorder also implements it (lockstepprom's does); the methods follow Recorder's rules (keyspace only as a
// label, fast, safe for concurrent use).
type NearRecorder interface {
	// NearHit counts a Get answered from memory (it is also counted as a Recorder.Hit).
	NearHit(keyspace string)
	// NearBypass counts a Get that could not use the near cache because the invalidation connection was down.
	NearBypass(keyspace string)
	// NearInvalidation counts one invalidation received: a key named by Redis, or a flush (FLUSHDB, FLUSHALL),
	// or the connection lost (each empties the whole near cache).
	NearInvalidation(keyspace string)
	// NearBytes reports the bytes the near cache holds (see NearCache.MaxBytes), after each change of the
	// connection's state and at each heartbeat.
	NearBytes(keyspace string, bytes int64)
}

// nearStore holds the values. A fill is a read of Redis that may end in a put: begin records the store's epoch
// and the shard's sequence; put stores the value only when the epoch did not move and no invalidation of the
// key itself is among the shard's invalidations since (nearShard.invalidatedSince; more than 64 of them refuse
// it too), i.e. no invalidation of the key, no flush and no connection loss reached the Client while the read
// was in flight (so a value read before a change can never be stored after the change's invalidation was
// applied).
type nearStore struct {
	maxStale  time.Duration
	shardMax  int64
	seed      maphash.Seed
	up        atomic.Bool   // the invalidation connection is subscribed and answering
	epoch     atomic.Uint64 // bumped by every flush and connection loss
	bytes     atomic.Int64  // sum over shards
	shards    [nearShards]nearShard
	clock     func() time.Time
	onInvalid func()              // counts one invalidation (NearRecorder.NearInvalidation)
	refetch   chan nearRefetchReq // keys to read again (nil: NoRefetch)
	renewMu   sync.Mutex          // guards renewQ; taken after a shard's mu, never before one
	renewQ    renewHeap           // values served since they were stored, by renewAt (Client.nearRefetch pops them)
}

// nearRefetchReq is one key to read again; warm: the value it replaces was served from memory, so the new one
// inherits that (nearEntry.inherited).
type nearRefetchReq struct {
	key  string
	warm bool
}

// renewItem is one held value waiting for its renewal: e, under key, from at.
type renewItem struct {
	at  time.Time
	key string
	e   *nearEntry
}

// renewHeap is a min-heap of renewItems by at (container/heap).
type renewHeap []renewItem

func (h renewHeap) Len() int           { return len(h) }
func (h renewHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h renewHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *renewHeap) Push(x any)        { *h = append(*h, x.(renewItem)) }
func (h *renewHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

// nearShard is one locked part of the store. mu guards every field.
type nearShard struct {
	mu  sync.Mutex
	seq uint64 // bumped by each invalidation of a key of this shard
	// recent[n % nearRecent] is the key whose invalidation made seq n: a fill whose ticket is older than seq is
	// refused only if its own key is among the invalidations since (or they are too many to tell), so a burst of
	// invalidations of other keys (a daemon batch's publish) does not refuse every fill and refetch in flight.
	recent [nearRecent]string
	items  map[string]*list.Element
	lru    list.List // of *nearEntry, most recently read first
	bytes  int64
}

type nearEntry struct {
	key      string
	val      []byte
	size     int64
	epoch    uint64
	deadline time.Time // by the Client's clock: served strictly before it
	served   bool      // served from memory since it was stored (worth a refetch when invalidated, and a renewal)
	// inherited: stored by a refetch of a value that had been served, so it is worth a refetch when invalidated
	// even if no read came between (a key read about once a second per instance is often invalidated by the
	// daemon's refresh before its first read after a renewal). One generation only: a refetch of an unserved
	// inherited value does not pass it on, so a key no longer read stops being refetched.
	inherited bool
	renewAt   time.Time // when the last fifth of its life begins (zero: never renewed; see nearRenewFraction)
	renewing  bool      // its renewal is queued
}

// nearRenewFraction: a value served from memory since it was stored is refetched in the background once the last
// fifth of its life there (deadline − start) begins, whether or not it is read then, so a hot key stays in memory
// across MaxStaleness instead of one reader per instance paying a Redis round trip each time it runs out (with
// a read-triggered renewal, a key read about once a second per instance missed its last second half the time:
// 6.7% of the hot reads of the N = 16 peers cell still went to Redis). Values held less than nearMinRenewLife
// are not renewed (a key about to expire in Redis would be refetched over and over). nearRenewTick is how often
// the due renewals are looked for, by the Client's clock.
const (
	nearRenewFraction = 0.2
	nearMinRenewLife  = 100 * time.Millisecond
	nearRenewTick     = 25 * time.Millisecond
)

// nearRecent is how many of a shard's latest invalidations are remembered by key (nearShard.recent).
const nearRecent = 64

// nearTicket is what begin hands to put.
type nearTicket struct {
	ok    bool
	epoch uint64
	seq   uint64
	start time.Time
	warm  bool // a refetch of a value that was served (nearEntry.inherited)
}

func newNearStore(n *NearCache, clock func() time.Time, onInvalid func()) *nearStore {
	s := &nearStore{
		maxStale:  n.MaxStaleness,
		shardMax:  n.MaxBytes / nearShards,
		seed:      maphash.MakeSeed(),
		clock:     clock,
		onInvalid: onInvalid,
	}
	for i := range s.shards {
		s.shards[i].items = map[string]*list.Element{}
	}
	if !n.NoRefetch {
		s.refetch = make(chan nearRefetchReq, nearRefetchQueue)
	}
	return s
}

func (s *nearStore) shard(key string) *nearShard {
	return &s.shards[maphash.String(s.seed, key)%nearShards]
}

// get returns the held value of key, or false; the slice is the store's and must not be changed.
func (s *nearStore) get(key string) ([]byte, bool) {
	if !s.up.Load() {
		return nil, false
	}
	epoch := s.epoch.Load()
	now := s.clock()
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	el, ok := sh.items[key]
	if !ok {
		return nil, false
	}
	e := el.Value.(*nearEntry)
	if e.epoch != epoch || !now.Before(e.deadline) {
		sh.remove(el)
		s.bytes.Add(-e.size)
		return nil, false
	}
	sh.lru.MoveToFront(el)
	if !e.served {
		e.served = true
		if s.refetch != nil && !e.renewAt.IsZero() {
			s.renewMu.Lock()
			heap.Push(&s.renewQ, renewItem{at: e.renewAt, key: key, e: e})
			s.renewMu.Unlock()
		}
	}
	return e.val, true
}

// renewDue queues a refetch of every held value whose renewal is due at now: served since it was stored, still
// held, and not queued already. Items of values replaced or dropped since are discarded.
func (s *nearStore) renewDue(now time.Time) {
	for {
		s.renewMu.Lock()
		if len(s.renewQ) == 0 || s.renewQ[0].at.After(now) {
			s.renewMu.Unlock()
			return
		}
		it := heap.Pop(&s.renewQ).(renewItem)
		s.renewMu.Unlock()
		sh := s.shard(it.key)
		sh.mu.Lock()
		el, ok := sh.items[it.key]
		if ok && el.Value.(*nearEntry) == it.e && !it.e.renewing && s.queueRefetch(it.key, true) {
			it.e.renewing = true
		}
		sh.mu.Unlock()
	}
}

// queueRefetch queues key for a refetch unless refetches are off or the queue is full; warm: see nearRefetchReq.
func (s *nearStore) queueRefetch(key string, warm bool) bool {
	if s.refetch == nil {
		return false
	}
	select {
	case s.refetch <- nearRefetchReq{key, warm}:
		return true
	default: // full: the next read fetches it
		return false
	}
}

// begin starts a fill of key; the ticket is not ok while the connection is down (a bypass).
func (s *nearStore) begin(key string) nearTicket {
	if !s.up.Load() {
		return nearTicket{}
	}
	t := nearTicket{ok: true, epoch: s.epoch.Load(), start: s.clock()}
	sh := s.shard(key)
	sh.mu.Lock()
	t.seq = sh.seq
	sh.mu.Unlock()
	return t
}

// put stores val (the caller's, not to be changed after) under key if nothing invalidated it since begin. ttl is
// the key's remaining Redis TTL as the read saw it (≤ 0: none).
func (s *nearStore) put(t nearTicket, key string, val []byte, ttl time.Duration) {
	if !t.ok {
		return
	}
	size := int64(len(key)+len(val)) + nearEntryOverhead
	if size > s.shardMax {
		return
	}
	life := s.maxStale
	if ttl > 0 && ttl < life {
		life = ttl
	}
	e := &nearEntry{key: key, val: val, size: size, epoch: t.epoch, deadline: t.start.Add(life), inherited: t.warm}
	if life >= nearMinRenewLife {
		e.renewAt = e.deadline.Add(-time.Duration(float64(life) * nearRenewFraction))
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if s.epoch.Load() != t.epoch || !s.up.Load() || sh.invalidatedSince(t.seq, key) {
		return
	}
	if old, ok := sh.items[key]; ok {
		s.bytes.Add(-old.Value.(*nearEntry).size)
		sh.remove(old)
	}
	for sh.bytes+size > s.shardMax {
		last := sh.lru.Back()
		s.bytes.Add(-last.Value.(*nearEntry).size)
		sh.remove(last)
	}
	sh.items[key] = sh.lru.PushFront(e)
	sh.bytes += size
	s.bytes.Add(size)
}

// invalidatedSince reports whether key may have been invalidated after seq: it was, or more invalidations than
// recent remembers happened since. sh.mu is held.
func (sh *nearShard) invalidatedSince(seq uint64, key string) bool {
	if sh.seq-seq > nearRecent {
		return true
	}
	for n := seq + 1; n <= sh.seq; n++ {
		if sh.recent[n%nearRecent] == key {
			return true
		}
	}
	return false
}

// remove drops el; sh.mu is held.
func (sh *nearShard) remove(el *list.Element) {
	e := el.Value.(*nearEntry)
	sh.lru.Remove(el)
	delete(sh.items, e.key)
	sh.bytes -= e.size
}

// invalidate drops key and fails the fills of its shard in flight. A dropped value that had been served from
// memory is queued for a refetch (NearCache.NoRefetch), after the shard's sequence moved, so the refetch's own
// ticket is newer than this invalidation.
func (s *nearStore) invalidate(key string) {
	s.onInvalid()
	sh := s.shard(key)
	sh.mu.Lock()
	sh.seq++
	sh.recent[sh.seq%nearRecent] = key
	served, warm := false, false
	if el, ok := sh.items[key]; ok {
		e := el.Value.(*nearEntry)
		served, warm = e.served || e.inherited, e.served
		s.bytes.Add(-e.size)
		sh.remove(el)
	}
	sh.mu.Unlock()
	if served {
		s.queueRefetch(key, warm)
	}
}

// reset empties the store and fails every fill in flight: on a flush (up stays) or a connection loss (up false).
func (s *nearStore) reset(up bool) {
	s.onInvalid()
	if !up {
		s.up.Store(false)
	}
	s.epoch.Add(1)
	s.renewMu.Lock()
	s.renewQ = nil
	s.renewMu.Unlock()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		s.bytes.Add(-sh.bytes)
		sh.items = map[string]*list.Element{}
		sh.lru.Init()
		sh.bytes = 0
		sh.mu.Unlock()
	}
}

// nearGet is Get's read of the cache key with the near cache on: from memory, else from Redis (GET and PTTL in
// one round trip), keeping what it read when the invalidation connection allows. It returns redis.Nil for a
// missing value, like a GET.
func (c *Client) nearGet(ctx context.Context, key string) ([]byte, error) {
	if v, ok := c.near.get(key); ok {
		if c.nearRec != nil {
			c.nearRec.NearHit(c.keyspace)
		}
		return bytes.Clone(v), nil
	}
	t := c.near.begin(key)
	if !t.ok {
		if c.nearRec != nil {
			c.nearRec.NearBypass(c.keyspace)
		}
		var v []byte
		err := c.call(ctx, func(ctx context.Context) error {
			b, err := c.rdb.Get(ctx, key).Bytes()
			v = b
			return err
		})
		if err != nil {
			return nil, err // f may still run (see call): v is not ours to read
		}
		return v, nil
	}
	return c.nearFill(ctx, t, key)
}

// nearFill reads key from Redis (GET and PTTL in one round trip) and stores the value under ticket t, which the
// caller took before the read. It returns redis.Nil for a missing value.
func (c *Client) nearFill(ctx context.Context, t nearTicket, key string) ([]byte, error) {
	v, pttl, _, err := c.readWithPTTL(ctx, key, "")
	if err != nil {
		return nil, err
	}
	if ttl := pttl.Val(); pttl.Err() == nil && ttl != -2 { // -2: the key went between the GET and the PTTL
		c.near.put(t, key, bytes.Clone(v), ttl)
	}
	return v, nil
}

// nearRefetch reads again, one at a time, the keys that invalidate and renewDue (every nearRenewTick) queued,
// until stop is closed. Each read is a
// fill like a reader's (its ticket taken after the invalidation was applied, bounded by the Client's timeouts);
// a missing key or an error stores nothing.
func (c *Client) nearRefetch(stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-stop
		cancel()
	}()
	tick := time.NewTicker(nearRenewTick)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			c.near.renewDue(c.near.clock())
		case req := <-c.near.refetch:
			if t := c.near.begin(req.key); t.ok {
				t.warm = req.warm
				_, _ = c.nearFill(ctx, t, req.key)
			}
		}
	}
}

// startNear builds the near cache on rdb and starts its tracker, stopped by Close.
func (c *Client) startNear(rdb *redis.Client) {
	c.nearRec, _ = c.rec.(NearRecorder)
	onInvalid, report := func() {}, func(int64) {}
	if r := c.nearRec; r != nil {
		onInvalid = func() { r.NearInvalidation(c.keyspace) }
		report = func(n int64) { r.NearBytes(c.keyspace, n) }
	}
	c.near = newNearStore(c.cfg.near, c.cfg.clock, onInvalid)
	t := newNearTracker(rdb, c.near, literalPrefix(c.keys.Cache), c.cfg.near.MaxLag, c.log, report)
	c.nearTracker = t
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		t.run(c.stop)
	}()
	if c.near.refetch != nil {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.nearRefetch(c.stop)
		}()
	}
}
