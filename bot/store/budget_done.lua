-- A call granted by budget_take.lua was answered (used '1'): it counts from now, the server's
-- clock, in each scope's window, since the platform saw it before this. Or it was never made
-- (used '0': a reply found stale after waiting its turn): its slot is given back.
-- An id no longer recorded (its window passed) is left alone.
local grant = ARGV[1]
local used = ARGV[2]

local now = now_ms()
for _, sent in ipairs(KEYS) do
  if used == '1' then
    redis.call('ZADD', sent, 'XX', now, grant)
  else
    redis.call('ZREM', sent, grant)
  end
end
return 1
