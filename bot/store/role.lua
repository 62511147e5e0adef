-- Claim or renew a role: an exclusive, expiring lease on a job shared by all replicas (such as
-- the one Telegram poller). Same primitive as the conversation lease: a random token, a fence
-- that only goes up, expiry on the server's clock.
-- KEYS: role (hash: token, fence; expires on its own), fences (hash: role name -> last fence)
-- ARGV: mode ('claim' | 'renew'), role name, token, fence (renew only), ttl ms
-- Returns, for claim: the fence if the role is now ours (newly taken, or already ours and
-- renewed), 0 if someone else holds it. For renew: 1 if renewed, 0 if it is no longer ours.
local role, fences = KEYS[1], KEYS[2]
local mode, name, token, ttl = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[5])

if mode == 'renew' then
  if not holds(role, token, ARGV[4]) then
    return 0
  end
  redis.call('PEXPIRE', role, ttl)
  return 1
end

if holds(role, token, nil) then
  redis.call('PEXPIRE', role, ttl)
  return tonumber(redis.call('HGET', role, 'fence'))
end
if redis.call('EXISTS', role) == 1 then
  return 0
end
local fence = redis.call('HINCRBY', fences, name, 1)
redis.call('HSET', role, 'token', token, 'fence', fence)
redis.call('PEXPIRE', role, ttl)
return fence
