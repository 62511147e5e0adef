-- Claim or renew a role: an exclusive, expiring lease on a job shared by all replicas (such as
-- the one Telegram poller). Same primitive as the conversation lease: a random token, a fence
-- that only goes up, expiry on the server's clock.
-- Returns, for claim: the fence if the role is now ours (newly taken, or already ours and
-- renewed), 0 if someone else holds it. For renew: 1 if renewed, 0 if it is no longer ours.
local role = KEYS[1] -- hash: token, fence; expires on its own
local fences = KEYS[2] -- hash: role name -> last fence
local mode = ARGV[1] -- 'claim' or 'renew'
local name = ARGV[2]
local token = ARGV[3]
local fence = ARGV[4] -- renew only
local ttl_ms = tonumber(ARGV[5])

if mode == 'renew' then
  if not holds(role, token, fence) then
    return 0
  end
  redis.call('PEXPIRE', role, ttl_ms)
  return 1
end

if holds(role, token, nil) then
  redis.call('PEXPIRE', role, ttl_ms)
  return tonumber(redis.call('HGET', role, 'fence'))
end
if redis.call('EXISTS', role) == 1 then
  return 0
end
local taken = redis.call('HINCRBY', fences, name, 1)
redis.call('HSET', role, 'token', token, 'fence', taken)
redis.call('PEXPIRE', role, ttl_ms)
return taken
