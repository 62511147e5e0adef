-- The wake-up: take the lease by compare-and-swap if the window has closed and a reply is owed.
-- A server clock that moved back (a failover to a node behind) leaves times further ahead than
-- the flow ever sets them; each is taken as run out, so the conversation is served now rather
-- than when the clock catches up: a lease expiring further ahead than the horizon (the longest
-- delay the flow sets, with slack), a backoff further ahead than its cap, a window deadline
-- further ahead than max_wait (each with the slack). Likewise the starvation guard's clock
-- (`since`): in the future, or older than the bound (a clock that moved forward), it starts
-- again from now.
-- Returns a status, and what goes with it:
--   busy     look_in_ms: until the lease expires
--   early    look_in_ms: until the moved deadline, or until speculation may start
--   backoff  look_in_ms: until the next attempt after failed ones
--   idle     nothing is owed (V == W); a stale wake-up is a no-op
--   acquired fence, version (V), watermark (W), lateness_ms, discards (in a row), resend (the
--            outbox's text, version, fence, token and changes, if one was left), unanswered
--            (pending json for (W, V]), history (json entries), failures (attempts in a row),
--            waited_ms (how long the oldest unanswered message has waited), model (picked
--            with /model, or ''), persona (the user's instructions, /persona, or ''),
--            window_ms (> 0: taken speculatively, the window still open that much longer; the
--            reply waits for it)
-- Speculation: once the user has been quiet for the window's speculate_at, the lease is taken
-- with the window still open. The window is then leased to this fence rather than consumed;
-- the pre-send check consumes it once it has closed. A burst the starvation guard will force
-- out is not speculated on: its reply could not wait for the window.
local state = KEYS[1]
local window = KEYS[2]
local lease = KEYS[3]
local due = KEYS[4]
local pending = KEYS[5]
local history = KEYS[6]
local outbox = KEYS[7]
local room = KEYS[8] -- in a group: the room's context (ingest.lua); a DM has none
local conversation = ARGV[1]
local token = ARGV[2]
local ttl_ms = tonumber(ARGV[3])
local history_entries = tonumber(ARGV[4])
local max_wait_ms = tonumber(ARGV[5])
local backoff_cap_ms = tonumber(ARGV[6])
local slack_ms = tonumber(ARGV[7])
-- The oldest age the starvation guard trusts (0: the guard's age is off).
local trusted_age_ms = tonumber(ARGV[8])
local starvation_limit = tonumber(ARGV[9]) -- discards in a row
local starvation_age_ms = tonumber(ARGV[10]) -- 0: off
local room_keep_ms = tonumber(ARGV[11]) -- the room's context is no older than this
local horizon = math.max(max_wait_ms, ttl_ms, backoff_cap_ms) + slack_ms
local now = now_ms()

local held = redis.call('PTTL', lease)
-- The lease's own TTL counts too: a replica configured with a longer one than ours (a rolling
-- change of LASTWORD_LEASE__TTL_MS) must not have its lease taken for a clock jump.
local granted = tonumber(redis.call('HGET', lease, 'ttl') or '0')
if held > 0 and held <= math.max(horizon, granted + slack_ms) then
  -- Look again when it expires, in case its holder died.
  redis.call('ZADD', due, now + held, conversation)
  return cjson.encode({status = 'busy', look_in_ms = held})
end

local counters = redis.call('HMGET', state, 'v', 'w', 'discards', 'failures', 'retry_at', 'since',
  'model', 'persona', 'last', 'trace')
local v, w = tonumber(counters[1] or '0'), tonumber(counters[2] or '0')
local left = redis.call('HMGET', outbox, 'text', 'version', 'fence', 'token', 'changes')
local has_outbox = left[1] ~= false

if v <= w and not has_outbox then
  redis.call('DEL', window)
  redis.call('ZREM', due, conversation)
  return cjson.encode({status = 'idle'})
end

-- After failed attempts the next one waits, whichever replica looks: a retry is backed off
-- across replicas.
local retry_at = tonumber(counters[5] or '0')
if retry_at > now + backoff_cap_ms + slack_ms then
  redis.call('HDEL', state, 'retry_at')
elseif retry_at > now then
  redis.call('ZADD', due, retry_at, conversation)
  return cjson.encode({status = 'backoff', look_in_ms = retry_at - now})
end

local discards, failures = tonumber(counters[3] or '0'), tonumber(counters[4] or '0')
local waited = now - tonumber(counters[6] or now)
if trusted_age_ms > 0 and (waited < 0 or waited > trusted_age_ms) then
  redis.call('HSET', state, 'since', now)
  waited = 0
end

-- When the burst's window closed (or will): its reply's place in the outbound budget's queue
-- (bot/outbound/pacing.py). A reply left in the outbox goes first.
local lateness, window_ms, closes_at = 0, 0, 0
if not has_outbox then
  local times = redis.call('HMGET', window, 'deadline', 'speculate_at')
  local deadline, speculate_at = tonumber(times[1] or '0'), tonumber(times[2] or '0')
  if deadline > now + max_wait_ms + slack_ms then
    deadline = now
  end
  local starved = discards >= starvation_limit
    or (starvation_age_ms > 0 and waited >= starvation_age_ms)
  closes_at = deadline > 0 and deadline or now
  if deadline > now and (speculate_at == 0 or speculate_at > now or starved) then
    local at = (speculate_at > now and not starved) and speculate_at or deadline
    redis.call('ZADD', due, at, conversation)
    return cjson.encode({status = 'early', look_in_ms = at - now})
  end
  if deadline > now then
    window_ms = deadline - now
  else
    if deadline > 0 then
      lateness = now - deadline
    end
    -- The window is consumed: messages from now on open a new one with a fresh cap.
    redis.call('DEL', window)
  end
end

local fence = redis.call('HINCRBY', state, 'fence', 1)
if window_ms > 0 then
  redis.call('HSET', window, 'leased', fence)
end
redis.call('HSET', lease, 'token', token, 'fence', fence, 'ttl', ttl_ms)
redis.call('PEXPIRE', lease, ttl_ms)
-- If we die, the sweep finds the conversation once the lease has expired.
redis.call('ZADD', due, now + ttl_ms, conversation)

local unanswered = {}
local resend = nil
if has_outbox then
  resend = {text = left[1], version = tonumber(left[2]), fence = tonumber(left[3] or '0'),
    token = left[4] or '', changes = left[5] or ''}
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
local past = redis.call('LRANGE', history, -history_entries, -1)
local context = {}
for _, entry in ipairs(redis.call('LRANGE', room, 0, -1)) do
  if tonumber(cjson.decode(entry).at or 0) >= now - room_keep_ms then
    context[#context + 1] = entry
  end
end
return cjson.encode({status = 'acquired', fence = fence, version = v, watermark = w,
  lateness_ms = lateness, discards = discards, resend = resend, unanswered = unanswered,
  history = past, failures = failures, waited_ms = waited, model = counters[7] or '',
  persona = counters[8] or '', window_ms = window_ms, closes_at_ms = closes_at,
  last = counters[9] or '', room = context, trace = counters[10] or ''})
