-- Shared by every script: loaded in front of each one, so the helpers exist once.

-- Milliseconds on the server's clock. Deadlines never use a replica's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Called whenever a lease ends. Schedules the next look at the conversation in the due-index,
-- or drops it from the index when everything is answered. Returns the delay in ms, or -1.
-- It only reads the window: only ingest (which opens and extends it) and acquire (which
-- consumes it) write the window, so a lease that ends never moves a deadline a message set.
local function reschedule(state_key, window_key, due_key, conv, now)
  local v = tonumber(redis.call('HGET', state_key, 'v') or '0')
  local w = tonumber(redis.call('HGET', state_key, 'w') or '0')
  if v <= w then
    redis.call('ZREM', due_key, conv)
    return -1
  end
  local deadline = tonumber(redis.call('HGET', window_key, 'deadline') or now)
  if deadline < now then
    deadline = now
  end
  redis.call('ZADD', due_key, deadline, conv)
  return deadline - now
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
