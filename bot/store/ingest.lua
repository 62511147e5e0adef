-- Ingest one message: dedupe, rate-limit, bump V, store it as pending, open or extend the
-- window, and put the deadline in the due-index. One round trip; nothing waits for the LLM.
-- Returns {status, version (V), look_in_ms (until the deadline, or -1), window}; status
-- 'accepted', 'refused' (its user may not talk to the bot), 'duplicate' (a redelivery),
-- 'silent' (said in a group the bot may not answer in), 'overheard' (said in a group, not to
-- the bot: kept in the room's context only),
-- 'limited' (dropped by the rate limit) or 'first_limited' (dropped by the rate limit, and the
-- first such in its window); window 'opened' when this message opened it, 'capped' when its
-- deadline is at the hard cap, 'extended' otherwise, 'none' if dropped. look_in_ms is until
-- the first moment a replica may start work: the window's deadline, or sooner, when the user has
-- been quiet for speculate_ms, if speculation is on (the reply is then held until the deadline).
-- Tracing on (`trace`, a candidate W3C traceparent): an accepted message joins its burst's trace,
-- or makes the candidate the burst's trace when none is open; the answer's `trace` is the
-- burst's, and `follows` the burst's before it when this message began the trace.
local state = KEYS[1]
local pending = KEYS[2]
local seen = KEYS[3]
local window = KEYS[4]
local due = KEYS[5]
local rate = KEYS[6]
local active = KEYS[7]
local history = KEYS[8]
local outbox = KEYS[9]
local usage = KEYS[10]
local access = KEYS[11] -- the shard's copies of the access records
local group = KEYS[12] -- in a group: whether admins allowed it
local room = KEYS[13] -- in a group: the room's context
local conversation = ARGV[1]
local message_id = ARGV[2]
local message = ARGV[3] -- json
local quiet_ms = tonumber(ARGV[4])
local max_wait_ms = tonumber(ARGV[5])
local seen_cap = tonumber(ARGV[6])
local rate_limit = tonumber(ARGV[7]) -- messages allowed per rate window (0: no limit)
local rate_window_ms = tonumber(ARGV[8])
local active_keep_ms = tonumber(ARGV[9])
local seen_keep_ms = tonumber(ARGV[10])
local retention_ms = tonumber(ARGV[11])
local verdict = ARGV[12] -- what the settings say of the user: 'admin', 'allowed' or 'refused'
local user = ARGV[13]
local speculate_ms = tonumber(ARGV[14]) -- 0: off
local learn_floor_ms = tonumber(ARGV[15]) -- the learned window's floor; 0: no learning
-- '' in a DM; in a group, 'allowed' if the settings allow it, else 'ask' (an admin's /allow)
local in_group = ARGV[16]
-- In a group: '1' addressed to the bot, '0' not (a follow-up if the sender's burst is open),
-- 'never' (another bot's: never answered)
local addressed = ARGV[17]
local said = ARGV[18] -- in a group: the message as the room's context keeps it (json)
local room_messages = tonumber(ARGV[19])
local room_keep_ms = tonumber(ARGV[20])
-- '1': the platform reports this user's typing (typing.lua holds the window while they type)
local typing = ARGV[21]
local trace = ARGV[22] -- '': tracing off
local now = now_ms()

local function answer(status, version, look_in_ms, flag, burst_trace, follows)
  return cjson.encode({status = status, version = version, look_in_ms = look_in_ms,
    window = flag, trace = burst_trace or '', follows = follows or ''})
end

-- The user's own pace, for a window that learns it. Each message adds the gap before it to the
-- last GAPS_KEPT, or a 0 when that gap was no pause within a burst (as long as the longest
-- window, or longer): the message before it had no follow-up. A gap the user was seen typing in
-- (a typing signal after the message before it) is marked 't': that follow-up was announced.
-- A user none of whose last messages had a follow-up gets the floor; one who followed up even
-- once keeps the setting.
-- Not a window shaped to their gaps: one too short splits a burst into two replies, which
-- costs the user far more than the wait (and speculation hides most of the wait), and a few
-- gaps are no guide to the next one. With fewer than GAPS_NEEDED gaps known, the setting.
-- Where the platform reports typing, a typing signal holds the window open (typing.lua), so
-- the floor is enough from the first message, and keeps being so unless the user followed up
-- later than the floor without being seen typing (a pasted line, a signal the platform lost).
local GAPS_KEPT, GAPS_NEEDED = 16, 4
local function learned_quiet(state_key, at, ceiling_ms, floor_ms, sees_typing)
  local known = redis.call('HMGET', state_key, 'gaps_at', 'gaps', 'typed_at')
  local gaps = {}
  for gap in string.gmatch(known[2] or '', '%d+t?') do
    gaps[#gaps + 1] = gap
  end
  if known[1] then
    local gap = at - tonumber(known[1])
    -- Two messages in the same millisecond are a follow-up too: 1, not the 0 of none.
    gap = (gap >= 0 and gap < ceiling_ms) and math.max(gap, 1) or 0
    local typed = gap > 0 and tonumber(known[3] or '0') > tonumber(known[1])
    gaps[#gaps + 1] = typed and (gap .. 't') or tostring(gap)
    while #gaps > GAPS_KEPT do
      table.remove(gaps, 1)
    end
  end
  redis.call('HSET', state_key, 'gaps_at', at, 'gaps', table.concat(gaps, ','))
  local floor = math.min(floor_ms, ceiling_ms)
  if sees_typing then
    for _, gap in ipairs(gaps) do
      local ms, typed = string.match(gap, '^(%d+)(t?)$')
      if typed == '' and tonumber(ms) > floor then
        return ceiling_ms
      end
    end
    return floor
  end
  if #gaps < GAPS_NEEDED then
    return ceiling_ms
  end
  for _, gap in ipairs(gaps) do
    if tonumber(string.match(gap, '^%d+')) > 0 then
      return ceiling_ms
    end
  end
  return floor
end

-- Whether the message's id is new, noted as seen if so. An id need only outlive the platforms'
-- redelivery horizon (Telegram keeps an update for a day), and no more than the newest ids:
-- bounded by age and by count.
local function first_seen()
  if redis.call('ZSCORE', seen, message_id) then
    return false
  end
  redis.call('ZADD', seen, now, message_id)
  redis.call('ZREMRANGEBYSCORE', seen, '-inf', now - seen_keep_ms)
  redis.call('ZREMRANGEBYRANK', seen, 0, -(seen_cap + 1))
  return true
end

local function duplicate()
  return answer('duplicate', tonumber(redis.call('HGET', state, 'v') or '0'), -1, 'none')
end

-- The platform's id of a message taken in as `id`: an edit's ('<id>:edit:<n>') is the edited
-- message's (bot.message.platform_id).
local function platform_id(id)
  local mark = string.find(id, ':edit:', 1, true)
  return mark and string.sub(id, 1, mark - 1) or id
end

-- An edit of a line still in the room takes that line's place, text and all, and keeps its
-- time (the room stays in order): the room shows what was said once, as it now reads. False if
-- this message is no edit, or the line it edits is gone. The room is capped: a short walk.
local function replace_edited(entry)
  local edited = platform_id(message_id)
  if edited == message_id then
    return false
  end
  local lines = redis.call('LRANGE', room, 0, -1)
  for i = #lines, 1, -1 do
    local line = cjson.decode(lines[i])
    if platform_id(tostring(line.id)) == edited then
      entry.at = line.at
      redis.call('LSET', room, i - 1, cjson.encode(entry))
      return true
    end
  end
  return false
end

-- In a group: silent unless allowed; a message not addressed to the bot joins its sender's
-- burst while that is open (the window, or a reply still owed for a message within max_wait),
-- and is otherwise said to the room: its context, never anyone's history.
if in_group ~= '' then
  local choice = redis.call('HGET', group, 'allowed')
  if choice == '0' or (in_group ~= 'allowed' and choice ~= '1') then
    return answer('silent', 0, -1, 'none')
  end
  local follows = false
  if addressed == '0' then
    local s = redis.call('HMGET', state, 'v', 'w', 'last_at')
    local deadline = redis.call('HGET', window, 'deadline')
    follows = (deadline and tonumber(deadline) > now)
      or (tonumber(s[1] or '0') > tonumber(s[2] or '0') and now - tonumber(s[3] or '0') < max_wait_ms)
  end
  if addressed ~= '1' and not follows then
    if not first_seen() then
      return duplicate()
    end
    -- Someone who only ever talks to the room has no conversation to keep this alive.
    if redis.call('PTTL', seen) < seen_keep_ms then
      redis.call('PEXPIRE', seen, seen_keep_ms)
    end
    if room_messages > 0 then
      local entry = cjson.decode(said)
      entry.at = now
      if not replace_edited(entry) then
        redis.call('RPUSH', room, cjson.encode(entry))
        redis.call('LTRIM', room, -room_messages, -1)
      end
      redis.call('PEXPIRE', room, room_keep_ms)
    end
    return answer('overheard', 0, -1, 'none')
  end
end

-- An admin's /allow or /deny overrides the allow-list, for anyone but an admin. A refused
-- message is never stored, so it never comes near the model.
if verdict ~= 'admin' then
  local record = redis.call('HGET', access, user)
  local access = record and cjson.decode(record).access
  if access == 'allow' then
    verdict = 'allowed'
  elseif access == 'deny' then
    verdict = 'refused'
  end
end
if verdict == 'refused' then
  return answer('refused', 0, -1, 'none')
end

if not first_seen() then
  return duplicate()
end

-- Who spoke lately, and the last message taken from them: a platform that can miss messages
-- while no replica listens (Discord's gateway) reads its history after that one.
redis.call('HSET', state, 'last', message_id, 'last_at', now)
redis.call('ZADD', active, now, conversation)
redis.call('ZREMRANGEBYSCORE', active, '-inf', now - active_keep_ms)

-- A DM conversation is one user, so its key is the per-user counter, in the same slot.
if rate_limit > 0 then
  local count = redis.call('INCR', rate)
  if count == 1 then
    redis.call('PEXPIRE', rate, rate_window_ms)
  end
  if count > rate_limit then
    local v = tonumber(redis.call('HGET', state, 'v') or '0')
    return answer(count == rate_limit + 1 and 'first_limited' or 'limited', v, -1, 'none')
  end
end

local v = redis.call('HINCRBY', state, 'v', 1)
redis.call('HSET', pending, v, message)
-- When the oldest unanswered message arrived: the starvation guard's clock. Only the first
-- message owed sets it; the commit moves it on.
redis.call('HSETNX', state, 'since', now)
-- The user wrote: whatever kept them from our replies (a block, closed DMs) may be over.
redis.call('HDEL', state, 'unreachable')

if learn_floor_ms > 0 then
  quiet_ms = learned_quiet(state, now, quiet_ms, learn_floor_ms, typing == '1')
end

-- The cap is anchored where the window opened, so a late message can never push it out.
local was = redis.call('HMGET', window, 'opened', 'deadline', 'leased')
local was_open = was[1]
if was_open and was[3] and tonumber(was[2]) <= now then
  -- A holder took this window's burst while it was open (speculatively), and it has closed
  -- since: that burst is the holder's, as if taken at the deadline, and this message opens the
  -- next window, as it would after an acquire at the deadline.
  redis.call('DEL', window)
  was_open = false
end
local opened = tonumber(was_open or now)
if opened > now then
  -- Opened in the future: the clock moved back (a failover to a node behind). Anchored there,
  -- the cap would hold the window open for as long as the clock was behind.
  opened = now
end
local cap = opened + max_wait_ms
local deadline = math.min(now + quiet_ms, cap)
-- Speculation may start once the user has been quiet for speculate_ms, if that comes before the
-- deadline (0: not in this window).
local speculate_at = 0
if speculate_ms > 0 and now + speculate_ms < deadline then
  speculate_at = now + speculate_ms
end
redis.call('HSET', window, 'opened', opened, 'deadline', deadline, 'speculate_at', speculate_at)
local wake_at = speculate_at > 0 and speculate_at or deadline
redis.call('ZADD', due, wake_at, conversation)
-- Lifetimes are renewed by the message that opens a window (and by the commit that answers
-- it): later ones of the same burst, seconds after, would only repeat it, and every key they
-- write already exists with its lifetime (HSET, ZADD, HINCRBY keep it). Seven commands fewer
-- for every message but the first of a burst.
if not was_open then
  keep_alive(retention_ms, state, pending, seen, window, history, outbox, usage)
end
local flag = 'extended'
if not was_open then
  flag = 'opened'
elseif deadline == cap then
  flag = 'capped'
end
-- The burst's trace lives in the state until the commit that answers it (prelude.lua).
local follows = ''
if trace ~= '' then
  if redis.call('HSETNX', state, 'trace', trace) == 1 then
    follows = redis.call('HGET', state, 'trace_prev') or ''
  else
    trace = redis.call('HGET', state, 'trace')
  end
end
return answer('accepted', v, math.max(wake_at - now, 0), flag, trace, follows)
