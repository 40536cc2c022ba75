// Package lockstep is keepwarm's Redis token-lock protocol and the app-side read-through client built on it. It
// keeps caches in front of an origin (PostgreSQL) from stampeding: when a value is missing or about to expire,
// exactly one process rebuilds it while the others wait or keep serving what they have. keepwarm's daemon, this
// package's Client and apps in other languages all speak the same protocol, specified in full (with the Lua
// script texts) in docs/protocol.md. The package imports nothing of the daemon: apps import it directly.
//
// # Key layout
//
// Each keyspace (e.g. "product") has key templates, parsed by NewKeys; ${id} is the record id, ${key} the finished
// cache key:
//
//	cache  product:${id}       the value, bytes exactly as loaded (no envelope)    PX ttl (jittered)
//	lock   lock:${key}         the rebuild lock, holding the leader's token        PX lock ttl
//	stale  stale:${key}        optional long-lived copy served when a rebuild lags PX stale ttl
//	meta   meta:${key}         optional hash: written_ms, delta_ms (WithMeta)      PX ttl (same as cache)
//	access keepwarm:access:<keyspace>  sorted set id → read count (AccessKey)      no TTL
//
// With Redis Cluster, a literal hash tag such as "{product}:${id}" keeps all of one id's keys in one slot (the
// default lock, stale and meta templates embed the cache key); Keys.CheckCluster refuses layouts that could split.
//
// # Token and lock
//
// A leader takes the lock with SET <lock> <token> NX PX <lock_ttl_ms> GET, where the token is 128 random bits
// from crypto/rand as 32 lowercase hex characters (NewToken); any unique string works, so an app using UUIDs
// interoperates. The reply is nil when the lock was free (now ours), else the holder's token: our own token means
// that go-redis re-sent the command after a lost reply and the first copy took the lock, so a lock is never lost
// to a retry. Servers older than Redis 7.0 refuse NX with GET; there a plain SET NX is followed, on a nil reply,
// by a GET of the lock compared with the token. Every change made under the lock is a Lua script that first checks GET <lock> == token:
// release.lua (Release: compare-and-delete), extend.lua (Extend: compare-and-PEXPIRE, a lease watchdog for slow
// rebuilds), publish.lua (Publish: compare, then SET the cache key PX ttl, HSET+PEXPIRE the meta hash or, without
// meta (Write.NoMeta, the Client's default), DEL any meta hash left, SET the stale copy when asked, DEL the lock;
// or, in delete mode, DEL cache, meta and stale), and extend_value.lua (ExtendValueMany: compare, then PEXPIREAT
// the cache key and the meta hash to one absolute time from one TIME, keep the start of staleness in the meta hash,
// DEL the lock). One script runs without a lock: extend_value_unlocked.lua (ExtendValueUnlockedMany), for when
// Redis refuses new keys (OOM) and so refuses the lock itself; it touches nothing while the lock key exists and
// only moves expiries later, within the same max_stale bound. Scripts run by EVALSHA; on NOSCRIPT
// (after SCRIPT FLUSH, a restart or a failover) single calls fall back to EVAL, and pipelined calls
// (AcquireMany, PublishMany, ...) load the script with SCRIPT LOAD and retry just the failed calls.
//
// # TTLs
//
// The cache TTL is jittered by every writer with Jitter: ttl × (1 + u·jitter), u uniform in [0, 1), so in
// [ttl, ttl×(1+jitter)) (default jitter 0.1). The meta hash, when kept, expires with the value. The lock TTL (default
// DefaultLockTTL, 5s) bounds a rebuild; the stale TTL (WithStale) should be much longer than the cache TTL.
//
// # Reading (Client.Get)
//
// A hit is one GET. On a miss, concurrent Gets of one id in a process are coalesced (singleflight); the process
// sends SET NX GET of the lock and a GET of the cache key in one pipeline. If the lock was taken and the GET found a
// value (another leader just published), the lock is released and the value returned. Otherwise the leader calls
// the Loader and publishes: a rebuild costs exactly two round trips. A follower (lock held elsewhere) polls the
// cache key with backoff (50ms, ×1.5, at most 200ms, 2s in all; WithWait), then serves the stale copy, or returns
// ErrRebuildTimeout. A follower never calls the Loader.
//
// # Failures
//
//   - Loader error: the lock is released, nothing is cached, Get returns the error (ErrNotFound when the origin
//     has no such record).
//   - Leader slower than the lock TTL: the lock expires, another process may lead; the late publish finds another
//     token (or none) and writes nothing (ErrLockLost). A newer value is never overwritten. The late leader's
//     caller still gets the value it loaded.
//   - Leader crashes: its lock expires after the lock TTL; followers serve stale or time out meanwhile.
//   - Origin down during a refresh (the daemon): ExtendValueMany keeps the old value for another TTL.
//   - Redis at maxmemory refusing new keys (OOM, noeviction): no lock can be taken; Get returns the OOM error on
//     a miss, and the daemon keeps hot values with ExtendValueUnlockedMany until Redis takes writes again.
//   - Redis down: Get returns the Redis error; it does not pass the load on to the origin.
//   - Redis frozen or a connection stalled: every round trip is bounded (WithRedisTimeout, default 1s, even for a
//     context without deadline, even when go-redis ignores context deadlines), and fails with ErrRedisTimeout. A
//     read that timed out is retried once, over a new connection, together with the stale copy, which is served
//     when the value is missing. A SET NX (or a release) whose reply was lost may still run when Redis wakes, so
//     the Client releases that lock in the background, token-checked, once Redis answers: no orphaned lock blocks
//     rebuilds for the lock TTL.
//   - Script cache flushed: see above; calls keep working.
//
// # Early refresh (XFetch)
//
// With WithXFetch(β), a hit also reads the key's PTTL in the same pipelined round trip (and, WithMeta(true), δ
// from the meta hash); δ is otherwise the Client's own measured rebuild time. It refreshes in the background, under the same lock, when
// now − δ·β·ln(u) ≥ expiry for u uniform in (0, 1] — "optimal probabilistic cache stampede prevention"
// (XFetch; A. Vattani, F. Chierichetti, K. Lowenstein, VLDB 2015). See XFetch.
//
// # Near cache
//
// With WithNearCache (off by default), hot values are also held in process memory, bounded in bytes. A dedicated
// connection (a RESP2 go-redis client cloned from rdb's options) runs CLIENT TRACKING ON REDIRECT <its id> BCAST
// PREFIX <cache prefix> and subscribes to __redis__:invalidate, so any writer's change of a key drops it at once;
// while that connection is down or late the near cache is emptied and bypassed, and a value is never served past
// NearCache.MaxStaleness on the Client's clock. See NearCache and docs/protocol.md §7.2 (Redis client-side caching, broadcasting mode).
//
// # Hot keys
//
// With WithAccessRecording, sampled reads are counted in memory and flushed off the request path as ZINCRBY into
// AccessKey(keyspace), which keepwarm's daemon reads to keep the hottest ids warm. Other apps feed the same set
// with ZINCRBY keepwarm:access:<keyspace> 1 <id> per read (or 1/rate per sampled read).
//
// # Metrics
//
// The Client reports through a Recorder (default NopRecorder). Package lockstep/lockstepprom has a Prometheus one
// that exports keepwarm_lockstep_* metrics labelled by keyspace and result, never by key or id; it lives apart
// so that importing lockstep does not pull in client_golang.
package lockstep
