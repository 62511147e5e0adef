-- Extend our lease, if it is still ours (token and fence both match).
-- Returns 1 if renewed, 0 if the lease is no longer ours.
local lease = KEYS[1]
local due = KEYS[2]
local conversation = ARGV[1]
local token = ARGV[2]
local fence = ARGV[3]
local ttl_ms = tonumber(ARGV[4])
if not holds(lease, token, fence) then
  return 0
end
redis.call('HSET', lease, 'ttl', ttl_ms)
redis.call('PEXPIRE', lease, ttl_ms)
redis.call('ZADD', due, now_ms() + ttl_ms, conversation)
return 1
