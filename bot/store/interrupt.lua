-- A newer message arrived while a reply was being generated, and the holder has already
-- cancelled the generation: give the lease back at once, as the pre-send check would after it.
-- The discard counts towards the starvation guard as a stale reply does. (A holder whose
-- reply the guard will force out does not interrupt at all: it learns the count on acquire.)
-- A reply already in the outbox, waiting for its turn in the outbound budget, is superseded the
-- same way: its outbox goes with the lease, and the next cycle covers everything.
-- A speculative generation (its lease took the window while still open) cut short by a message
-- that extended that window is 'restarted' instead: no reply went stale, so no discard counts.
-- Returns {status = 'stale' | 'restarted', look_in_ms = ms until the next look} |
-- {status = 'lost', look_in_ms = -1}
local lease = KEYS[1]
local state = KEYS[2]
local window = KEYS[3]
local due = KEYS[4]
local totals = KEYS[5] -- the shard's totals of today
local outbox = KEYS[6]
local conversation = ARGV[1]
local token = ARGV[2]
local fence = ARGV[3]
local totals_keep_ms = tonumber(ARGV[4])
if not holds(lease, token, fence) then
  return cjson.encode({status = 'lost', look_in_ms = -1})
end
local status = 'stale'
if leased_to(window, fence) then
  redis.call('HDEL', window, 'leased')
  status = 'restarted'
else
  redis.call('HINCRBY', state, 'discards', 1)
  count_today(totals, 'interrupted', totals_keep_ms)
end
if redis.call('HGET', outbox, 'fence') == fence then
  redis.call('DEL', outbox)
end
redis.call('DEL', lease)
return cjson.encode({status = status,
  look_in_ms = reschedule(state, window, due, conversation, now_ms())})
