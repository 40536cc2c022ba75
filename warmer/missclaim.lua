-- missclaim.lua: claims one SLO miss for the fleet (missclaim.go). The claim key holds the Unix ms at which the
-- last counted miss of the key was seen.
-- KEYS[1] the claim key; ARGV[1] threshold (Unix ms): a claim seen at or after it is the same miss;
-- ARGV[2] when this miss was seen (Unix ms); ARGV[3] the claim's TTL (ms).
-- Returns 1 when this replica counts the miss, 0 when it was counted already.
local prev = tonumber(redis.call('GET', KEYS[1]) or '')
if prev and prev >= tonumber(ARGV[1]) then
  return 0
end
local seen = tonumber(ARGV[2])
if prev and prev > seen then
  seen = prev
end
redis.call('SET', KEYS[1], seen, 'PX', ARGV[3])
return 1
