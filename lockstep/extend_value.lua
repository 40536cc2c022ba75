-- lockstep extend-value v4 (fail-safe): when a rebuild cannot reach the origin, keep serving the old value a
-- while longer, but never past a fleet-wide bound. Only while the lock holds the caller's token: extend the TTL
-- of the cache key and its meta hash, then release the lock. The start of staleness is kept in the meta hash
-- (field stale_since_ms, Unix ms by the server's clock): the first extension sets it to the value's own expiry,
-- later ones (by any process) keep it, and a real publish clears it, so max_stale bounds every daemon together.
-- v3 (same arguments and replies as v2): the new expiry is an absolute time computed from one TIME and set with
-- PEXPIREAT on both keys, and the value's own expiry is read with PEXPIRETIME (Redis >= 7.0; older servers use
-- TIME + PTTL), so that a pause of the server inside the script cannot move either past the bound.
-- v4 (same arguments and replies): the first write is PEXPIREAT of the cache key, which cannot grow memory, so
-- that Redis at maxmemory with noeviction (which refuses a script only at a first write that may) still runs it;
-- stale_since_ms is written only when absent, and if Redis refuses it the cache key's expiry is set back and the
-- error returned, the lock still held.
-- KEYS[1] = cache key, KEYS[2] = lock key, KEYS[3] = meta key
-- ARGV[1] = token, ARGV[2] = wanted cache TTL in milliseconds (integer >= 1),
-- ARGV[3] = max_stale in milliseconds (integer >= 0): no extension reaches past stale_since_ms + max_stale
-- Returns {status, ttl_ms}: status 1 when the cache key was extended to ttl_ms; 2 when it was not extended
-- because the bound leaves no more than its current TTL (ttl_ms = current PTTL; never shortened); -1 when the
-- cache key is gone (nothing extended); in these three cases the lock is released. 0 when the lock is not held
-- by this token (nothing touched). A meta key of the wrong type is a WRONGTYPE error before any write; a refused
-- stale_since_ms (OOM) is that error reply, with the cache key's expiry set back and the lock kept.
if redis.call("GET", KEYS[2]) ~= ARGV[1] then
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
  redis.call("DEL", KEYS[2])
  return {-1, 0}
end
if pttl == -1 then
  redis.call("DEL", KEYS[2])
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
local at = now + tonumber(ARGV[2])
local limit = since + tonumber(ARGV[3])
if at > limit then
  at = limit
end
if at <= expiry or at <= now then
  redis.call("DEL", KEYS[2])
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
redis.call("DEL", KEYS[2])
return {1, at - now}
