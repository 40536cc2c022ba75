-- lockstep publish v3: write (or delete) a rebuilt value and release the lock, only while the lock holds the
-- caller's token, so that a leader whose lock expired, or whose key was invalidated, never writes an old value.
-- KEYS[1] = cache key, KEYS[2] = lock key, KEYS[3] = meta key, KEYS[4] = stale key (optional)
-- ARGV[1] = token
-- ARGV[2] = mode: "set" writes the value, "del" deletes cache, meta and stale (the origin row is gone)
-- ARGV[3] = value (bytes, stored as given; "" in "del" mode)
-- ARGV[4] = cache TTL in milliseconds (integer >= 1; "0" in "del" mode)
-- ARGV[5] = rebuild duration (delta) in milliseconds (integer >= 0)
-- ARGV[6] = stale TTL in milliseconds (integer >= 1 when KEYS[4] is given in "set" mode, else "0")
-- ARGV[7] = meta mode (optional, new in v3): "nometa" writes no meta hash and deletes the one left by an older
-- write or by extend_value.lua (so its stale_since_ms ends with the staleness); absent or "meta" writes it (v2).
-- Returns {status, old_pttl}: status 1 when written (or deleted) and the lock released, 0 when the lock holds
-- another token, -1 when the lock key is gone (expired, evicted, or deleted by invalidate.lua); nothing is
-- written unless status is 1. old_pttl is the cache key's PTTL in milliseconds just before the call (-2: it did
-- not exist, -1: it had no TTL), so the caller learns whether the value expired before it was replaced.
-- Lua does not roll back, so the script fails before its first write or not at all: with meta it checks the meta
-- key's type first (a WRONGTYPE reply then leaves everything untouched, the lock still held by the caller, who
-- releases it), and Redis refuses a script for OOM only at its first write. The cache key is written first and
-- the lock deleted last.
local lock = redis.call("GET", KEYS[2])
local old = redis.call("PTTL", KEYS[1])
if lock == false then
  return {-1, old}
end
if lock ~= ARGV[1] then
  return {0, old}
end
local nometa = ARGV[7] == "nometa"
if not nometa then
  local mtype = redis.call("TYPE", KEYS[3])["ok"]
  if mtype ~= "hash" and mtype ~= "none" then
    return redis.error_reply("WRONGTYPE meta key " .. KEYS[3] .. " holds a " .. mtype .. ", not a hash")
  end
end
if ARGV[2] == "del" then
  redis.call("DEL", KEYS[1], KEYS[3])
  if KEYS[4] then
    redis.call("DEL", KEYS[4])
  end
else
  redis.call("SET", KEYS[1], ARGV[3], "PX", ARGV[4])
  if nometa then
    redis.call("DEL", KEYS[3])
  else
    local t = redis.call("TIME")
    local now_ms = string.format("%d%03d", t[1], math.floor(t[2] / 1000))
    redis.call("HSET", KEYS[3], "written_ms", now_ms, "delta_ms", ARGV[5])
    redis.call("HDEL", KEYS[3], "stale_since_ms")
    redis.call("PEXPIRE", KEYS[3], ARGV[4])
  end
  if KEYS[4] then
    redis.call("SET", KEYS[4], ARGV[3], "PX", ARGV[6])
  end
end
redis.call("DEL", KEYS[2])
return {1, old}
