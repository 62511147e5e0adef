-- The wake-up: take the lease by compare-and-swap if the window has closed and a reply is owed.
-- A server clock that moved back (a failover to a node behind) leaves times further ahead than
-- the flow ever sets them; each is taken as run out, so the conversation is served now rather
-- than when the clock catches up: a lease expiring further ahead than the horizon (the longest
-- delay the flow sets, with slack), a backoff further ahead than its cap, a window deadline
-- further ahead than max_wait (each with the slack). Likewise the starvation guard's clock
-- (`since`): in the future, or older than the bound (a clock that moved forward), it starts
-- again from now.
-- KEYS: state, window, lease, due, pending, history, outbox
-- ARGV: conversation, token, ttl ms, history entries to return, max wait ms, backoff cap ms,
--       clock slack ms, the oldest age the starvation guard trusts in ms (0: the guard's age
--       is off)
-- Returns one of
--   {'busy', ms until the lease expires}
--   {'early', ms until the moved deadline}
--   {'backoff', ms until the next attempt after failed ones}
--   {'idle'}                      nothing is owed (V == W); a stale wake-up is a no-op
--   {'acquired', fence, V, W, lateness ms, discards in a row, {outbox text, outbox version}
--    or {}, {pending json (W, V]}, {history json}, failed attempts in a row,
--    the outbox's fence and token, or '' and '', ms the oldest unanswered message has waited,
--    the model the user picked with /model or '', the admin changes the outbox announces or
--    ''}
local state, window, lease, due = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local pending, history, outbox = KEYS[5], KEYS[6], KEYS[7]
local conv, ttl = ARGV[1], tonumber(ARGV[3])
local max_wait, backoff_cap, slack = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local horizon = math.max(max_wait, ttl, backoff_cap) + slack
local now = now_ms()

local held = redis.call('PTTL', lease)
-- The lease's own TTL counts too: a replica configured with a longer one than ours (a rolling
-- change of LASTWORD_LEASE__TTL_MS) must not have its lease taken for a clock jump.
local granted = tonumber(redis.call('HGET', lease, 'ttl') or '0')
if held > 0 and held <= math.max(horizon, granted + slack) then
  -- Look again when it expires, in case its holder died.
  redis.call('ZADD', due, now + held, conv)
  return {'busy', held}
end

local counters = redis.call('HMGET', state, 'v', 'w', 'discards', 'failures', 'retry_at', 'since',
  'model')
local v, w = tonumber(counters[1] or '0'), tonumber(counters[2] or '0')
local left = redis.call('HMGET', outbox, 'text', 'version', 'fence', 'token', 'changes')
local has_outbox = left[1] ~= false

if v <= w and not has_outbox then
  redis.call('DEL', window)
  redis.call('ZREM', due, conv)
  return {'idle'}
end

-- After failed attempts the next one waits, whichever replica looks (SPEC: a retry is backed
-- off across replicas).
local retry_at = tonumber(counters[5] or '0')
if retry_at > now + backoff_cap + slack then
  redis.call('HDEL', state, 'retry_at')
elseif retry_at > now then
  redis.call('ZADD', due, retry_at, conv)
  return {'backoff', retry_at - now}
end

local lateness = 0
if not has_outbox then
  local deadline = tonumber(redis.call('HGET', window, 'deadline') or '0')
  if deadline > now + max_wait + slack then
    deadline = now
  end
  if deadline > now then
    redis.call('ZADD', due, deadline, conv)
    return {'early', deadline - now}
  end
  if deadline > 0 then
    lateness = now - deadline
  end
  -- The window is consumed: messages from now on open a new one with a fresh cap.
  redis.call('DEL', window)
end

local fence = redis.call('HINCRBY', state, 'fence', 1)
redis.call('HSET', lease, 'token', ARGV[2], 'fence', fence, 'ttl', ttl)
redis.call('PEXPIRE', lease, ttl)
-- If we die, the sweep finds the conversation once the lease has expired.
redis.call('ZADD', due, now + ttl, conv)

local unanswered = {}
local resend = {}
if has_outbox then
  resend = {left[1], left[2]}
elseif v > w then
  -- In chunks: unpack() fails past ~8000 values, and a script error here would leave the
  -- lease taken and the window consumed, wedging the conversation on every retry.
  for first = w + 1, v, 1000 do
    local ids = {}
    for i = first, math.min(first + 999, v) do
      ids[#ids + 1] = i
    end
    for _, message in ipairs(redis.call('HMGET', pending, unpack(ids))) do
      unanswered[#unanswered + 1] = message
    end
  end
end
local past = redis.call('LRANGE', history, -tonumber(ARGV[4]), -1)
local discards, failures = tonumber(counters[3] or '0'), tonumber(counters[4] or '0')
local waited = now - tonumber(counters[6] or now)
local trusted = tonumber(ARGV[8])
if trusted > 0 and (waited < 0 or waited > trusted) then
  redis.call('HSET', state, 'since', now)
  waited = 0
end
return {'acquired', fence, v, w, lateness, discards, resend, unanswered, past, failures,
  left[3] or '', left[4] or '', waited, counters[7] or '', left[5] or ''}
