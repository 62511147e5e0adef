-- A newer message arrived while a reply was being generated, and the holder has already
-- cancelled the generation: give the lease back at once, as the pre-send check would after it.
-- The discard counts towards the starvation guard as a stale reply does. (A holder whose
-- reply the guard will force out does not interrupt at all: it learns the count on acquire.)
-- KEYS: lease, state, window, due, the shard's totals of today
-- ARGV: conversation, token, fence, totals keep ms
-- Returns {'stale', ms until the next look} | {'lost', -1}
local lease, state, window, due = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
if not holds(lease, ARGV[2], ARGV[3]) then
  return {'lost', -1}
end
redis.call('HINCRBY', state, 'discards', 1)
count_today(KEYS[5], 'interrupted', tonumber(ARGV[4]))
redis.call('DEL', lease)
return {'stale', reschedule(state, window, due, ARGV[1], now_ms())}
