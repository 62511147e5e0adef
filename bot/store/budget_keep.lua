-- A replica's replies are still waiting their turn: their tickets live on, all in one call
-- however many wait (budget_take.lua drops a ticket not kept alive for `ticket_ttl_ms`). A
-- ticket already gone (granted, left, or expired) is not brought back; one that lapsed (its
-- replica died) is dropped here, and counted as a place given back.
-- Returns how many places have been given back early so far (`freed`: budget_leave.lua,
-- budget_take.lua's answers of calls never made, lapsed tickets), so the replica can tell its first waiting replies that
-- theirs may come sooner than they were told.
local tickets = KEYS[1]
local freed = KEYS[2]
local ticket_ttl_ms = tonumber(ARGV[1])
local freed_keep_ms = tonumber(ARGV[2])

local now = now_ms()
drop_lapsed(tickets, freed, now, 64, freed_keep_ms)
local kept = 0
for i = 3, #ARGV do
  kept = kept + redis.call('ZADD', tickets, 'XX', 'CH', now + ticket_ttl_ms, ARGV[i])
end
if kept > 0 and redis.call('PTTL', tickets) < ticket_ttl_ms then
  redis.call('PEXPIRE', tickets, ticket_ttl_ms)
end
return tonumber(redis.call('GET', freed) or '0')
