-- lockstep extend v1: reset the lock's TTL only while it still holds the caller's token (lease watchdog).
-- KEYS[1] = lock key
-- ARGV[1] = token, ARGV[2] = new lock TTL in milliseconds (integer >= 1)
-- Returns 1 when the TTL was reset, 0 when the lock is held by another token or is gone.
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return 0
