-- Give the lease back without a reply, if it is still ours. A late release from a holder
-- that timed out finds another token and changes nothing.
-- After a failed attempt (a platform or store error), the next one is backed off: the count
-- of failures in a row and the time of the next attempt live in the state and the due-index,
-- so the backoff holds whichever replica looks next.
-- KEYS: lease, state, window, due
-- ARGV: conversation, token, failed (0/1), first backoff ms, backoff cap ms
-- Returns {'released' | 'lost', ms until the next look or -1}
local lease, state, window, due = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
if not holds(lease, ARGV[2], nil) then
  return {'lost', -1}
end
redis.call('DEL', lease)
local now = now_ms()
if ARGV[3] == '1' then
  local failures = redis.call('HINCRBY', state, 'failures', 1)
  local delay = math.min(tonumber(ARGV[4]) * 2 ^ math.min(failures - 1, 30), tonumber(ARGV[5]))
  redis.call('HSET', state, 'retry_at', now + delay)
  redis.call('ZADD', due, now + delay, ARGV[1])
  return {'released', delay}
end
return {'released', reschedule(state, window, due, ARGV[1], now)}
