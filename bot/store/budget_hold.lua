-- The platform answered a 429: the scope grants nothing to any replica for `hold_ms`. A hold
-- only grows: a shorter retry_after, heard later, never cuts a longer one short.
-- `holds` lists the scopes held, each with when its hold ends, for `lastword status`.
local hold = KEYS[1]
local holds = KEYS[2]
local scope = ARGV[1]
local hold_ms = tonumber(ARGV[2])

local now = now_ms()
local hold_until = now + hold_ms
if tonumber(redis.call('GET', hold) or '0') < hold_until then
  redis.call('SET', hold, hold_until, 'PX', hold_ms)
  redis.call('ZADD', holds, hold_until, scope)
  if redis.call('PTTL', holds) < hold_ms then
    redis.call('PEXPIRE', holds, hold_ms)
  end
end
return hold_until
