-- A reply stopped waiting its turn without taking it (cancelled by a newer message, failed, its
-- replica shutting down): its place goes at once, rather than keep the replies behind it waiting
-- until its ticket expires; `freed` counts it, so every replica's waiting replies learn that
-- they may come sooner than they were told (budget_keep.lua).
local tickets = KEYS[1]
local freed = KEYS[2]
local ticket = ARGV[1]
local freed_keep_ms = tonumber(ARGV[2])

redis.call('ZREM', tickets, ticket)
for i = 3, #KEYS do
  redis.call('ZREM', KEYS[i], ticket)
end
redis.call('INCR', freed)
redis.call('PEXPIRE', freed, freed_keep_ms)
return 1
