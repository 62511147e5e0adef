-- Shared by every script: loaded in front of each one, so the helpers exist once.

-- Milliseconds on the server's clock. Deadlines never use a replica's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Called whenever a lease ends. Schedules the next look at the conversation in the due-index,
-- or drops it from the index when everything is answered. Returns the delay in ms, or -1.
-- The next look is at the window's deadline, or at the moment speculation may start if that
-- comes first. It never moves a deadline a message set: only ingest (which opens and extends
-- the window) and the steps that consume it (an acquire at the deadline, a speculative reply's
-- pre-send check) change it.
local function reschedule(state_key, window_key, due_key, conv, now)
  local v = tonumber(redis.call('HGET', state_key, 'v') or '0')
  local w = tonumber(redis.call('HGET', state_key, 'w') or '0')
  if v <= w then
    redis.call('ZREM', due_key, conv)
    return -1
  end
  local times = redis.call('HMGET', window_key, 'deadline', 'speculate_at')
  local at = tonumber(times[1] or now)
  local speculate_at = tonumber(times[2] or '0')
  if speculate_at > 0 and speculate_at < at then
    at = speculate_at
  end
  if at < now then
    at = now
  end
  redis.call('ZADD', due_key, at, conv)
  return at - now
end

-- Whether the window is leased to the holder with this fence: taken while still open (a
-- speculative generation), so its reply waits for the deadline, and a message that extends the
-- window restarts that generation rather than counting as a stale reply.
local function leased_to(window_key, fence)
  if not fence then
    return false
  end
  return redis.call('HGET', window_key, 'leased') == tostring(fence)
end

-- A lease belongs to us only if both the token and the fence match.
local function holds(lease_key, token, fence)
  local current = redis.call('HMGET', lease_key, 'token', 'fence')
  return current[1] == token and (fence == nil or current[2] == fence)
end

-- Retention: every key a conversation keeps for long gets the same lifetime, renewed by every
-- step that writes it, so an idle conversation expires whole and its next message starts
-- afresh. (A key that does not exist is left alone: PEXPIRE creates nothing.)
local function keep_alive(ms, ...)
  for _, key in ipairs({...}) do
    redis.call('PEXPIRE', key, ms)
  end
end

-- One more of something a day counts in the shard's totals for `/stats` and `lastword status`
-- (replies, interrupted, forced). The totals outlive their day by a day.
local function count_today(totals, field, keep_ms)
  redis.call('HINCRBY', totals, field, 1)
  redis.call('PEXPIRE', totals, keep_ms)
end

-- A conversation's tool record (tool_step.lua) holds a few turns, each under fields of its own:
-- 'id:<turn>', 'steps:<turn>', and 's:', 'v:', 'c:' fields named '<x>:<turn>:...'. The turns
-- it holds, oldest first.
local function record_turns(tools)
  local turns = {}
  for _, field in ipairs(redis.call('HKEYS', tools)) do
    local turn = string.match(field, '^id:(%d+)$')
    if turn then
      table.insert(turns, tonumber(turn))
    end
  end
  table.sort(turns)
  return turns
end

-- Drop one turn's fields from a tool record; with `from_step`, only its steps from that one on.
local function drop_turn(tools, turn, from_step)
  local prefix = ':' .. turn .. ':'
  for _, field in ipairs(redis.call('HKEYS', tools)) do
    local whole = not from_step and (field == 'id:' .. turn or field == 'steps:' .. turn)
    local mine = string.sub(field, 2, #prefix + 1) == prefix
    if mine and from_step then
      mine = tonumber(string.match(string.sub(field, #prefix + 2), '^(%d+)')) >= from_step
    end
    if whole or mine then
      redis.call('HDEL', tools, field)
    end
  end
end

-- W moves to `covered`, the version a sent (or given up) reply answered. The starvation guard's
-- clock then runs from the oldest message still owed: it arrived after the lease was taken, so
-- it opened the window that is open now (the lease's acquire consumed the one before).
local function answered_to(state, window, covered)
  redis.call('HSET', state, 'w', covered)
  -- The burst's trace ends with its reply; the next burst's links to it (ingest.lua).
  local trace = redis.call('HGET', state, 'trace')
  if trace then
    redis.call('HSET', state, 'trace_prev', trace)
    redis.call('HDEL', state, 'trace')
  end
  if tonumber(redis.call('HGET', state, 'v') or '0') > covered then
    redis.call('HSET', state, 'since', redis.call('HGET', window, 'opened') or now_ms())
  else
    redis.call('HDEL', state, 'since')
  end
end

-- What every end of a reply's cycle does: the counts of discards, failures and outages start
-- again, the outbox (so the reply is never sent again) and the lease go, and the next look is
-- scheduled.
local function reply_ended(state, window, due, outbox, lease, conversation)
  redis.call('HSET', state, 'discards', 0)
  redis.call('HDEL', state, 'failures', 'outages', 'retry_at')
  redis.call('DEL', outbox, lease)
  return cjson.encode({status = 'committed',
    look_in_ms = reschedule(state, window, due, conversation, now_ms())})
end

-- Add a reply's tokens to a day's and a month's counts (a place's, usage.lua; a person's,
-- person_usage.lua): weighed by the model's cost (tokens, the budget's) and as spent (prompt,
-- completion). Returns the weighed tokens of the day so far.
local function add_spent(day, month, prompt, completion, cost, day_keep_ms, month_keep_ms)
  local weighed = math.floor((prompt + completion) * cost + 0.5)
  local spent = redis.call('HINCRBY', day, 'tokens', weighed)
  for _, key in ipairs({day, month}) do
    redis.call('HINCRBY', key, 'prompt', prompt)
    redis.call('HINCRBY', key, 'completion', completion)
  end
  redis.call('HINCRBY', month, 'tokens', weighed)
  redis.call('PEXPIRE', day, day_keep_ms)
  redis.call('PEXPIRE', month, month_keep_ms)
  return spent
end

-- The outbound budget's tickets whose replica stopped keeping them alive (it died): dropped, at
-- most `limit` at a time, and counted in `freed` as places given back, so the replies told to
-- wait behind them hear of it (budget_take.lua, budget_keep.lua).
local function drop_lapsed(tickets, freed, now, limit, freed_keep_ms)
  local lapsed = redis.call('ZRANGEBYSCORE', tickets, '-inf', now, 'LIMIT', 0, limit)
  for _, gone in ipairs(lapsed) do
    redis.call('ZREM', tickets, gone)
  end
  if #lapsed > 0 then
    redis.call('INCRBY', freed, #lapsed)
    redis.call('PEXPIRE', freed, freed_keep_ms)
  end
end
