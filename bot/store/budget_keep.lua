-- A replica's replies are still waiting their turn, and its calls granted are still on their
-- way: both live on, in one call however many (budget_take.lua drops a ticket not kept alive
-- for `lapse_ms`, and counts a call in flight as made once it lapses). A ticket already gone
-- (granted, left, or expired) is not brought back; one that lapsed (its replica died) is
-- dropped here, and counted as a place given back. A call is kept in flight only while it is
-- recorded (a window that passed dropped it), and never counted earlier than it was.
-- Returns how many places have been given back early so far (`freed`: budget_leave.lua,
-- budget_take.lua's answers of calls never made, lapsed tickets), so the replica can tell its
-- first waiting replies that theirs may come sooner than they were told.
-- ARGV past the named ones: the tickets' count, the tickets, then each call's (grant, scope
-- count); KEYS past the named ones: each call's scopes' sent, in the same order.
local tickets = KEYS[1]
local freed = KEYS[2]
local lapse_ms = tonumber(ARGV[1])
local freed_keep_ms = tonumber(ARGV[2])
local NAMED = 2

local now = now_ms()
drop_lapsed(tickets, freed, now, 64, freed_keep_ms)
local kept = 0
local arg = NAMED + 2
for i = arg, arg + tonumber(ARGV[NAMED + 1]) - 1 do
  kept = kept + redis.call('ZADD', tickets, 'XX', 'CH', now + lapse_ms, ARGV[i])
end
if kept > 0 and redis.call('PTTL', tickets) < lapse_ms then
  redis.call('PEXPIRE', tickets, lapse_ms)
end
arg = arg + tonumber(ARGV[NAMED + 1])
local key = 3
while arg <= #ARGV do
  local grant, count = ARGV[arg], tonumber(ARGV[arg + 1])
  for i = key, key + count - 1 do
    local at = tonumber(redis.call('ZSCORE', KEYS[i], grant) or '0')
    if at > 0 and at < now + lapse_ms then
      redis.call('ZADD', KEYS[i], 'XX', now + lapse_ms, grant)
    end
  end
  arg, key = arg + 2, key + count
end
return tonumber(redis.call('GET', freed) or '0')
