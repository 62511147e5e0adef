-- /forget, in the conversation's slot: ask for the confirmation, check it was asked lately,
-- or erase what is kept about the user in this place (a /forget runs it on every place of the
-- person's, `Personal.forget`): the history, the cached transcripts and documents (the
-- entries the index `heard` names, each under the index's name, ':', its file key), the model
-- and persona they picked, the pace a learning window keeps of them, and in a group what they
-- said to the room. Counters without content (usage totals, the dedupe ids, V and W)
-- stay; the messages the burst covers leave with the commit (a reset).
-- Returns 1, or for 'asked' 1 if the confirmation was asked within confirm_ms, else 0
local state = KEYS[1]
local history = KEYS[2]
local heard = KEYS[3] -- the index of cached files (transcript.lua)
local tools = KEYS[4] -- the turn's record of tool calls and their results (tool_step.lua)
local room = KEYS[5] -- in a group: the room's context (ingest.lua)
local mode = ARGV[1] -- 'ask' | 'asked' | 'erase'
local confirm_ms = tonumber(ARGV[2]) -- how long a confirmation is awaited
local user = ARGV[3] -- in a group: whose words leave the room's context
local now = now_ms()
if mode == 'ask' then
  -- Only on a live conversation: a field set on a missing key would keep it for ever.
  if redis.call('EXISTS', state) == 1 then
    redis.call('HSET', state, 'forget_asked', now)
  end
  return 1
end
if mode == 'asked' then
  local asked = tonumber(redis.call('HGET', state, 'forget_asked') or '')
  if asked ~= nil and asked <= now and now - asked <= confirm_ms then
    return 1
  end
  return 0
end
-- Derived from the index's name, so in its slot: the same node holds every one.
for _, file_key in ipairs(redis.call('ZRANGE', heard, 0, -1)) do
  redis.call('DEL', heard .. ':' .. file_key)
end
redis.call('DEL', history, heard, tools)
-- The room's context is bounded (ingest.lua), so this is a short walk.
local kept = {}
for _, entry in ipairs(redis.call('LRANGE', room, 0, -1)) do
  if cjson.decode(entry).user ~= user then
    kept[#kept + 1] = entry
  end
end
if #kept < redis.call('LLEN', room) then
  local ttl = redis.call('PTTL', room)
  redis.call('DEL', room)
  if #kept > 0 then
    redis.call('RPUSH', room, unpack(kept))
    redis.call('PEXPIRE', room, math.max(ttl, 1))
  end
end
redis.call('HDEL', state, 'model', 'persona', 'forget_asked', 'gaps_at', 'gaps')
return 1
