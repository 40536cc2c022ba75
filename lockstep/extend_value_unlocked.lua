-- lockstep extend-value-unlocked v1 (fail-safe when Redis refuses new keys): when no lock can be taken because
-- Redis is at maxmemory and refuses new keys (SET NX answers OOM under maxmemory-policy noeviction), keep serving
-- the old value a while longer, under the same fleet-wide bound as extend_value.lua. It takes no token, so it
-- touches nothing while the lock key exists (an app or another daemon is rebuilding: its publish decides), writes
-- no value, and only moves expiries later, never earlier: it cannot put an old value over a newer one.
-- The bound: stale_since_ms in the meta hash (Unix ms by the server's clock), set by the first extension to the
-- value's own expiry, kept by later ones (by any process, with or without a lock), cleared by a real publish; the
-- new expiry is min(now + wanted TTL, stale_since_ms + max_stale), one absolute time from one TIME, set with
-- PEXPIREAT on the cache key and the meta hash.
-- Under OOM Redis refuses a script only at its first write, and only if that command may grow memory; the first
-- write here is PEXPIREAT of the cache key, which may not. Recording stale_since_ms may grow memory: one field in
-- the meta hash, which creates the hash when the value has none (no-meta mode). That one small key per value kept
-- stale is what holds max_stale for the whole fleet; without it every extension would start a new max_stale. If
-- Redis refuses the record anyway, the cache key's expiry is set back and the error returned: no extension
-- without its bound.
-- KEYS[1] = cache key, KEYS[2] = lock key, KEYS[3] = meta key
-- ARGV[1] = wanted cache TTL in milliseconds (integer >= 1),
-- ARGV[2] = max_stale in milliseconds (integer >= 0): no extension reaches past stale_since_ms + max_stale
-- Returns {status, ttl_ms}: status 1 when the cache key was extended to ttl_ms; 2 when it was not extended
-- because the bound, or its current TTL, leaves no more (ttl_ms = current PTTL, -1 for a key without TTL); -1
-- when the cache key is gone; 0 when the lock key exists. Nothing is touched unless status is 1. A meta key of the
-- wrong type is a WRONGTYPE error before any write.
if redis.call("EXISTS", KEYS[2]) == 1 then
  return {0, 0}
end
local mtype = redis.call("TYPE", KEYS[3])["ok"]
if mtype ~= "hash" and mtype ~= "none" then
  return redis.error_reply("WRONGTYPE meta key " .. KEYS[3] .. " holds a " .. mtype .. ", not a hash")
end
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local pttl = redis.call("PTTL", KEYS[1])
if pttl == -2 then
  return {-1, 0}
end
if pttl == -1 then
  return {2, -1}
end
local expiry = redis.pcall("PEXPIRETIME", KEYS[1])
if type(expiry) ~= "number" or expiry < 0 then
  expiry = now + pttl
end
local since = tonumber(redis.call("HGET", KEYS[3], "stale_since_ms"))
local record = since == nil
if record then
  since = expiry
end
local at = now + tonumber(ARGV[1])
local limit = since + tonumber(ARGV[2])
if at > limit then
  at = limit
end
if at <= expiry or at <= now then
  return {2, pttl}
end
redis.call("PEXPIREAT", KEYS[1], string.format("%d", at))
if record then
  local r = redis.pcall("HSET", KEYS[3], "stale_since_ms", string.format("%d", since))
  if type(r) == "table" and r.err then
    redis.call("PEXPIREAT", KEYS[1], string.format("%d", expiry))
    return r
  end
end
redis.call("PEXPIREAT", KEYS[3], string.format("%d", at))
return {1, at - now}
