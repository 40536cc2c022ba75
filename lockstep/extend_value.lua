-- lockstep extend-value v1 (fail-safe): when a rebuild cannot reach the origin, keep serving the old value a
-- while longer. Only while the lock holds the caller's token: reset the TTL of the cache key and its meta hash,
-- then release the lock.
-- KEYS[1] = cache key, KEYS[2] = lock key, KEYS[3] = meta key
-- ARGV[1] = token, ARGV[2] = new cache TTL in milliseconds (integer >= 1)
-- Returns 1 when the cache key was extended, -1 when the cache key is gone (nothing extended; the lock is still
-- released), 0 when the lock is not held by this token (nothing touched).
if redis.call("GET", KEYS[2]) ~= ARGV[1] then
  return 0
end
local found = redis.call("PEXPIRE", KEYS[1], ARGV[2])
if found == 1 then
  redis.call("PEXPIRE", KEYS[3], ARGV[2])
end
redis.call("DEL", KEYS[2])
if found == 1 then
  return 1
end
return -1
