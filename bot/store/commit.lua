-- After the reply was sent: W = the version it covered, the answered messages and the reply
-- move to the history, the outbox is cleared and the lease released, all in one step.
-- History is only ever appended and trimmed, never rewritten, so no update is lost; a /reset
-- among the covered messages empties it first, and only what came after the /reset is kept.
-- The outcome says what became of the reply: 'sent'; 'unreachable' (the user blocked the bot or
-- closed their DMs: marked until they write again, unless they already did); 'abandoned' (a
-- permanent platform error, or too many failed attempts). Only a sent reply joins the history,
-- which holds what the user saw; the messages it covered are answered either way.
-- Returns {status = 'committed' | 'lost', look_in_ms = ms until the next look or -1}
local lease = KEYS[1]
local state = KEYS[2]
local pending = KEYS[3]
local history = KEYS[4]
local outbox = KEYS[5]
local window = KEYS[6]
local due = KEYS[7]
local seen = KEYS[8]
local usage = KEYS[9]
local totals = KEYS[10] -- the shard's totals of today
local tools = KEYS[11] -- the tool record of the turn (tool_step.lua)
local conversation = ARGV[1]
local token = ARGV[2]
local fence = ARGV[3]
local history_cap = tonumber(ARGV[4])
local outcome = ARGV[5]
local retention_ms = tonumber(ARGV[6])
local totals_keep_ms = tonumber(ARGV[7])
if not holds(lease, token, fence) then
  return cjson.encode({status = 'lost', look_in_ms = -1})
end

local reply = redis.call('HMGET', outbox, 'text', 'version', 'reset', 'replaces', 'unsaid', 'tools',
  'turn')
local covered = tonumber(reply[2])
local reset = tonumber(reply[3] or '0') or 0
local replaces = tonumber(reply[4] or '0') or 0
-- The message the history leaves out (a /retry's, or 0), and `said`: how many bytes at the end
-- of the text the model said (the command answers and notices before them are what the user
-- saw, never the model's).
local told = cjson.decode(reply[5] or '{}')
local unsaid = tonumber(told.message) or 0
local said = ',"said":' .. (tonumber(told.said) or 0)
local w = tonumber(redis.call('HGET', state, 'w') or '0')
if covered ~= nil and covered > w then
  if reset > w then
    redis.call('DEL', history)
    -- The records of earlier turns go with the history they belonged to (the one of the turn
    -- this reply answers stays: a /retry of it finds it).
    for _, turn in ipairs(record_turns(tools)) do
      if turn <= w then
        drop_turn(tools, turn)
      end
    end
  end
  for i = w + 1, covered do
    local message = redis.call('HGET', pending, i)
    if message then
      if i > reset and i ~= unsaid then
        -- Spliced as text: a cjson round trip would turn empty lists into objects.
        redis.call('RPUSH', history, '{"role":"user","v":' .. i .. ',"message":' .. message .. '}')
      end
      redis.call('HDEL', pending, i)
    end
  end
  if outcome == 'sent' and replaces > 0 then
    -- A /retry: the new reply takes the old one's place (the messages it answered stay).
    local old = '{"role":"assistant","v":' .. replaces .. ','
    for _, entry in ipairs(redis.call('LRANGE', history, 0, -1)) do
      if string.sub(entry, 1, #old) == old then
        redis.call('LREM', history, 1, entry)
        break
      end
    end
  end
  if outcome == 'sent' then
    count_today(totals, 'replies', totals_keep_ms)
    -- The tool calls it made go with it, so a follow-up question can use what they gave.
    local used = ''
    if reply[6] and reply[6] ~= '' then
      used = ',"tools":' .. cjson.encode(reply[6])
    end
    -- Its turn (0: every message before it not yet answered).
    local turn = tonumber(reply[7] or '') or 0
    -- What a /retry writes again: its turn's record is kept whatever newer turns record.
    if turn > 0 and redis.call('EXISTS', tools) == 1 then
      redis.call('HSET', tools, 'kept', turn)
    end
    redis.call('RPUSH', history, '{"role":"assistant","v":' .. covered .. ',"text":'
      .. cjson.encode(reply[1]) .. used .. ',"turn":' .. turn .. said .. '}')
  end
  redis.call('LTRIM', history, -history_cap, -1)
  answered_to(state, window, covered)
end
if outcome == 'unreachable' and tonumber(redis.call('HGET', state, 'v') or '0') == covered then
  redis.call('HSET', state, 'unreachable', 1)
end
keep_alive(retention_ms, state, pending, history, seen, usage)
return reply_ended(state, window, due, outbox, lease, conversation)
