-- Give the lease back without a reply, if it is still ours. A late release from a holder
-- that timed out finds another token and changes nothing.
-- After a failed attempt, the next one is backed off: the count of failures in a row and the
-- time of the next attempt live in the state and the due-index, so the backoff holds
-- whichever replica looks next. An outage (the store or the platform out of reach) is backed
-- off the same way but counted apart: `failures` is what LASTWORD_LLM__ATTEMPTS counts, and an
-- outage says nothing of whether the burst can be answered.
-- Returns {status = 'released' | 'lost', look_in_ms = ms until the next look or -1}
local lease = KEYS[1]
local state = KEYS[2]
local window = KEYS[3]
local due = KEYS[4]
local conversation = ARGV[1]
local token = ARGV[2]
local failed = ARGV[3] -- 'failure', 'outage' or '' (not failed)
local backoff_ms = tonumber(ARGV[4]) -- after the first failure or outage; doubling after each
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
if failed ~= '' then
  redis.call('HINCRBY', state, failed == 'outage' and 'outages' or 'failures', 1)
  local counted = redis.call('HMGET', state, 'failures', 'outages')
  local in_a_row = tonumber(counted[1] or '0') + tonumber(counted[2] or '0')
  local delay = math.min(backoff_ms * 2 ^ math.min(in_a_row - 1, 30), backoff_cap_ms)
  redis.call('HSET', state, 'retry_at', now + delay)
  redis.call('ZADD', due, now + delay, conversation)
  return answer('released', delay)
end
return answer('released', reschedule(state, window, due, conversation, now))
