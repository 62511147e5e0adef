-- A person's conversation in a group that moved to a new chat (a Telegram group upgraded to a
-- supergroup), in the new chat's slot: it takes the history, persona, model and record of tool
-- calls of the same person's conversation in the old chat, as the caller read them in the old
-- chat's slot (no script may touch both). The record comes along so that a /retry of an
-- adopted reply reuses its calls (the same ids, so the same idempotency keys), never runs
-- them again. Only a conversation the new chat has never written to (no state, no history)
-- takes them: a person who already spoke there keeps what they have, and a second run finds
-- the state this one wrote and changes nothing.
-- V and W start at the old conversation's W, so the versions of the new chat's messages come
-- after those the adopted history holds, as one conversation's do.
-- Returns 1 if adopted, 0 if left as it was
local state = KEYS[1]
local history = KEYS[2]
local tools = KEYS[3] -- the record of tool calls (tool_step.lua)
local version = tonumber(ARGV[1]) -- the old conversation's W: what its history answered
local persona = ARGV[2] -- the person's instructions ('' for none)
local model = ARGV[3] -- the model they picked ('' for the default)
local retention_ms = tonumber(ARGV[4])
local record = ARGV[5] -- the old record as a JSON object, field -> value ('' for none)
if redis.call('EXISTS', state) == 1 or redis.call('EXISTS', history) == 1 then
  return 0
end
local fields = {'v', version, 'w', version}
if persona ~= '' then
  table.insert(fields, 'persona')
  table.insert(fields, persona)
end
if model ~= '' then
  table.insert(fields, 'model')
  table.insert(fields, model)
end
redis.call('HSET', state, unpack(fields))
-- The entries past the named arguments, oldest first, as the old conversation keeps them;
-- pushed a chunk at a time, since unpack() takes a bounded number of values and the history's
-- cap has no bound of its own.
local first, last = 6, #ARGV
while first <= last do
  local upto = math.min(first + 999, last)
  redis.call('RPUSH', history, unpack(ARGV, first, upto))
  first = upto + 1
end
if record ~= '' then
  for field, value in pairs(cjson.decode(record)) do
    redis.call('HSET', tools, field, value)
  end
end
keep_alive(retention_ms, state, history, tools)
return 1
