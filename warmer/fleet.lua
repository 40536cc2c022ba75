-- fleet.lua: one replica's heartbeat in the fleet's member set, and the member list, in one command.
-- KEYS[1]: the fleet's sorted set; member = replica id, score = when its heartbeat expires (Redis TIME, ms).
-- ARGV[1]: this replica's id; ARGV[2]: the heartbeat TTL in ms; ARGV[3]: "join" to heartbeat, "leave" to leave.
-- Expired members are removed on every call, and the set itself expires with its newest member, so a member
-- that stops heartbeating (kill -9) leaves within one TTL and nothing leaks when the whole fleet is gone.
-- Returns {now_ms, {member, expiry_ms, member, expiry_ms, ...}, existed}: existed is 0 when the set was gone
-- before this call (a new fleet, or a FLUSHDB/FLUSHALL/restart that emptied Redis), else 1.
local existed = redis.call('EXISTS', KEYS[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[3] == 'join' then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
local members = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
if #members > 0 then
  redis.call('PEXPIREAT', KEYS[1], math.floor(tonumber(members[#members])))
end
return {now, members, existed}
