-- lockstep publish v1: write (or delete) a rebuilt value and release the lock, only while the lock holds the
-- caller's token, so that a leader whose lock expired can never overwrite a newer value.
-- KEYS[1] = cache key, KEYS[2] = lock key, KEYS[3] = meta key, KEYS[4] = stale key (optional)
-- ARGV[1] = token
-- ARGV[2] = mode: "set" writes the value, "del" deletes cache, meta and stale (the origin row is gone)
-- ARGV[3] = value (bytes, stored as given; "" in "del" mode)
-- ARGV[4] = cache TTL in milliseconds (integer >= 1; "0" in "del" mode)
-- ARGV[5] = rebuild duration (delta) in milliseconds (integer >= 0)
-- ARGV[6] = stale TTL in milliseconds (integer >= 1 when KEYS[4] is given in "set" mode, else "0")
-- Returns 1 when written (or deleted) and the lock released, 0 when the lock is not held by this token
-- (nothing is written then).
if redis.call("GET", KEYS[2]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == "del" then
  redis.call("DEL", KEYS[1], KEYS[3])
  if KEYS[4] then
    redis.call("DEL", KEYS[4])
  end
else
  redis.call("SET", KEYS[1], ARGV[3], "PX", ARGV[4])
  local t = redis.call("TIME")
  local now_ms = string.format("%d%03d", t[1], math.floor(t[2] / 1000))
  redis.call("HSET", KEYS[3], "written_ms", now_ms, "delta_ms", ARGV[5])
  redis.call("PEXPIRE", KEYS[3], ARGV[4])
  if KEYS[4] then
    redis.call("SET", KEYS[4], ARGV[3], "PX", ARGV[6])
  end
end
redis.call("DEL", KEYS[2])
return 1
