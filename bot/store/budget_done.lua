-- A call granted by budget_take.lua was answered (used '1'): it counts from now, the server's
-- clock, in each scope's window, since the platform saw it before this. Or it was never made
-- (used '0': a reply found stale after waiting its turn): its slot is given back, and `freed`
-- counts it, so every replica's waiting replies learn that a slot came free early
-- (budget_keep.lua).
-- An id no longer recorded (its window passed) is left alone.
local freed = KEYS[1]
local grant = ARGV[1]
local used = ARGV[2]
local freed_keep_ms = tonumber(ARGV[3])

local now = now_ms()
for i = 2, #KEYS do
  if used == '1' then
    redis.call('ZADD', KEYS[i], 'XX', now, grant)
  else
    redis.call('ZREM', KEYS[i], grant)
  end
end
if used ~= '1' then
  redis.call('INCR', freed)
  redis.call('PEXPIRE', freed, freed_keep_ms)
end
return 1
