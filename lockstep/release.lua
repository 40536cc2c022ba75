-- lockstep release v1: delete the lock only while it still holds the caller's token.
-- KEYS[1] = lock key
-- ARGV[1] = token
-- Returns 1 when the lock was released, 0 when it is held by another token or is gone.
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
