// Package warmer decides which keys are hot and refreshes them before they expire (refresh-ahead).
//
// # What is hot
//
// Per keyspace, three signals are combined:
//   - pinned ids from the [[hotkeys]] lists, always hot;
//   - the access sorted set (default "keepwarm:access:<keyspace>"), fed by the lockstep client or by any app
//     with one ZINCRBY per read. The warmer reads its top 2×top_n on every poll and its top max_tracked once a
//     minute; it halves the scores every decay_half_life (ZUNIONSTORE of the set onto itself with a weight, done
//     by one replica per interval under a lease key) and trims the set to max_tracked members;
//   - Redis LFU counters (OBJECT FREQ) of keys found by a rate-limited SCAN MATCH of the key pattern, only when
//     the keyspace asks for it and maxmemory-policy is an LFU policy.
//
// The hot set is the pinned ids plus at most top_n admitted ids, best ranked first, each ranking at least
// min_score: an id is admitted once reads were seen in two polls (a doorkeeper against scans, after TinyLFU and
// ARC), its rank fades with decay_half_life once no signal names it, and it loses its admission when its
// refreshes keep going unread (see selection.go). top_n is a ceiling, not a target. The hot set is
// frozen during an origin outage. The tracked set is bounded by max_tracked; when it is full the coldest entry
// leaves first. Cold keys are never refreshed: the daemon spends no origin budget on the long tail.
//
// # When a hot key expires
//
// For keys it wrote, the warmer knows the expiry (it takes the time before sending the publish, so its estimate
// is never late). For keys an app wrote it reads PTTL, pipelined, when a key becomes hot. Keyspace
// notifications (expired, evicted, del, set) give early notice where enabled; because pub/sub loses events
// across reconnects, and each cluster node publishes only its own, a periodic pipelined PTTL reconciliation of
// the hot set is the ground truth. PTTL −2 means gone; PTTL −1 means no TTL: the key is reported
// (keepwarm_warmer_keys_persistent) and never overwritten.
//
// # When and how it refreshes
//
// A min-heap orders hot keys by due time, expiry − lead − e, where lead is refresh_ahead but never less than
// lead_multiple × the key's rebuild p95 estimate, and e is an XFetch-style random offset δ·(−ln u), capped at
// lead/2, so that replicas do not collide (Vattani, Chierichetti, Lowenstein, VLDB 2015). Due keys of one
// keyspace are grouped into batches of batch_size (keys due within a short gathering window join). Each batch:
// waits for the keyspace's origin token bucket; acquires the locks with lockstep (pipelined); skips keys locked
// elsewhere and re-checks them later; re-reads PTTL under the locks so a key an app just rebuilt is not rebuilt
// again; runs one Source query (bounded by the statement timeout plus lock_ttl/3); publishes with lockstep's
// token-checked script (pipelined) with TTL ttl × (1 + U[0, jitter)) and the stale copy; and applies the missing
// policy to ids the origin no longer has. The batch's locks are short leases, min(lock_ttl, max(500ms,
// lead/4)), renewed every lease/4 from the acquisition to the release, so that the locks of a replica that dies
// lapse within a fraction of the lead; lock_ttl stays the apps' lock TTL. At most max_origin_concurrency batches query the origin at once; when more keys are due than the budget allows
// they wait in due order, the hottest first among equals.
//
// # Fail-safe
//
// When the origin fails, the warmer extends each current hot value's TTL under its lock until the next retry
// (with back-off), rather than letting it expire into a stampede against a sick database. No value is kept more
// than max_stale past its last good expiry. Extensions are counted (keepwarm_warmer_failsafe_extensions_total)
// and logged once per keyspace per outage.
//
// When Redis refuses the locks themselves for memory (OOM: maxmemory reached with noeviction, so no new key can
// be written), no process can rebuild a value into Redis; the warmer then extends the hot values without a lock
// (lockstep.ExtendValueUnlockedMany: nothing while a lock exists, the same max_stale bound), retries the locks
// with back-off inside the extended life, counts it with mode="unlocked", and logs the episode once.
// Warmer.WritesRefused reports whether Redis refuses writes (OOM, READONLY on a replica, NOPERM from an ACL), as
// seen by the flush canary and by the batches' locks and publishes.
//
// # SLO
//
// keepwarm_warmer_hot_expired_total counts hot keys that expired before their refresh. It should stay at 0.
package warmer
