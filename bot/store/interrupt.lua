-- A newer message arrived while a reply was being generated: give the lease back at once, as
-- the pre-send check would after the generation, unless the starvation guard wants this
-- reply to go out anyway. The discard counts towards that guard as a stale reply does.
-- KEYS: lease, state, window, due
-- ARGV: conversation, token, fence, version the prompt covered, starvation limit
-- Returns {'stale', ms until the next look} | {'keep', 0} | {'lost', -1}
local lease, state, window, due = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
if not holds(lease, ARGV[2], ARGV[3]) then
  return {'lost', -1}
end
if tonumber(redis.call('HGET', state, 'v')) == tonumber(ARGV[4]) then
  return {'keep', 0}
end
local discards = tonumber(redis.call('HGET', state, 'discards') or '0')
if discards >= tonumber(ARGV[5]) then
  -- Starvation guard: let this generation finish; the pre-send check will force it out.
  return {'keep', 0}
end
redis.call('HINCRBY', state, 'discards', 1)
redis.call('DEL', lease)
return {'stale', reschedule(state, window, due, ARGV[1], now_ms())}
