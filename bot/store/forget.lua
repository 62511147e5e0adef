-- /forget, in the conversation's slot: ask for the confirmation, check it was asked lately,
-- or erase what is kept about the user. Counters without content (usage totals, the dedupe
-- ids, V and W) stay; the messages the burst covers leave with the commit (a reset).
-- KEYS: state, history, then the conversation's cached transcripts and documents
-- ARGV: 'ask' | 'asked' | 'erase', how long a confirmation is awaited in ms
-- Returns 1, or for 'asked' 1 if the confirmation was asked within that long, else 0
local state, history = KEYS[1], KEYS[2]
local mode = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if mode == 'ask' then
  -- Only on a live conversation: a field set on a missing key would keep it for ever.
  if redis.call('EXISTS', state) == 1 then
    redis.call('HSET', state, 'forget_asked', now)
  end
  return 1
end
if mode == 'asked' then
  local asked = tonumber(redis.call('HGET', state, 'forget_asked') or '')
  if asked ~= nil and asked <= now and now - asked <= tonumber(ARGV[2]) then
    return 1
  end
  return 0
end
redis.call('HDEL', state, 'model', 'persona', 'forget_asked')
for i = 2, #KEYS do
  redis.call('DEL', KEYS[i])
end
return 1
