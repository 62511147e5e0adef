-- Give the lease back without a reply, if it is still ours. A late release from a holder
-- that timed out finds another token and changes nothing.
-- After a failed attempt (a platform or store error), the next one is backed off: the count
-- of failures in a row and the time of the next attempt live in the state and the due-index,
-- so the backoff holds whichever replica looks next.
-- Returns {status = 'released' | 'lost', look_in_ms = ms until the next look or -1}
local lease = KEYS[1]
local state = KEYS[2]
local window = KEYS[3]
local due = KEYS[4]
local conversation = ARGV[1]
local token = ARGV[2]
local failed = ARGV[3] -- '1' or '0'
local backoff_ms = tonumber(ARGV[4]) -- after the first failure; doubling after each
local backoff_cap_ms = tonumber(ARGV[5])

local function answer(status, look_in_ms)
  return cjson.encode({status = status, look_in_ms = look_in_ms})
end

if not holds(lease, token, nil) then
  return answer('lost', -1)
end
-- A speculative holder gives its window back with its lease: the next holder takes it anew.
if leased_to(window, redis.call('HGET', lease, 'fence')) then
  redis.call('HDEL', window, 'leased')
end
redis.call('DEL', lease)
local now = now_ms()
if failed == '1' then
  local failures = redis.call('HINCRBY', state, 'failures', 1)
  local delay = math.min(backoff_ms * 2 ^ math.min(failures - 1, 30), backoff_cap_ms)
  redis.call('HSET', state, 'retry_at', now + delay)
  redis.call('ZADD', due, now + delay, conversation)
  return answer('released', delay)
end
return answer('released', reschedule(state, window, due, conversation, now))
