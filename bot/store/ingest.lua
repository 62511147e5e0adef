-- Ingest one message: dedupe, rate-limit, bump V, store it as pending, open or extend the
-- window, and put the deadline in the due-index. One round trip; nothing waits for the LLM.
-- KEYS: state, pending, seen, window, due, rate, active, history, outbox, usage, the shard's
--       access records
-- ARGV: conversation, message id, message json, quiet ms, max wait ms, seen cap,
--       messages allowed per rate window (0: no limit), rate window ms, active keep ms,
--       seen keep ms, retention ms, what the settings say of the user ('admin', 'allowed' or
--       'refused'), user id
-- Returns {status, V, ms until the deadline or -1, window}; status 'accepted', 'refused' (its
-- user may not talk to the bot), 'duplicate' (a redelivery), 'limited' (dropped by the rate
-- limit) or 'first_limited' (dropped by the rate limit, and the first such in its window);
-- window 'opened' when this message opened it,
-- 'capped' when its deadline is at the hard cap, 'extended' otherwise, 'none' if dropped
local state, pending, seen, window, due, rate = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local active = KEYS[7]
local retention = tonumber(ARGV[11])
local now = now_ms()

-- An admin's /allow or /deny overrides the allow-list, for anyone but an admin. A refused
-- message is never stored, so it never comes near the model.
local verdict = ARGV[12]
if verdict ~= 'admin' then
  local record = redis.call('HGET', KEYS[11], ARGV[13])
  local access = record and cjson.decode(record).access
  if access == 'allow' then
    verdict = 'allowed'
  elseif access == 'deny' then
    verdict = 'refused'
  end
end
if verdict == 'refused' then
  return {'refused', 0, -1, 'none'}
end

if redis.call('ZSCORE', seen, ARGV[2]) then
  return {'duplicate', tonumber(redis.call('HGET', state, 'v') or '0'), -1, 'none'}
end
redis.call('ZADD', seen, now, ARGV[2])
-- An id need only outlive the platforms' redelivery horizon (Telegram keeps an update for a
-- day), and no more than the newest ids: bounded by age and by count.
redis.call('ZREMRANGEBYSCORE', seen, '-inf', now - tonumber(ARGV[10]))
redis.call('ZREMRANGEBYRANK', seen, 0, -(tonumber(ARGV[6]) + 1))

-- Who spoke lately, and the last message taken from them: a platform that can miss messages
-- while no replica listens (Discord's gateway) reads its history after that one.
redis.call('HSET', state, 'last', ARGV[2])
redis.call('ZADD', active, now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', active, '-inf', now - tonumber(ARGV[9]))

-- A DM conversation is one user, so its key is the per-user counter, in the same slot.
local limit = tonumber(ARGV[7])
if limit > 0 then
  local count = redis.call('INCR', rate)
  if count == 1 then
    redis.call('PEXPIRE', rate, tonumber(ARGV[8]))
  end
  if count > limit then
    local v = tonumber(redis.call('HGET', state, 'v') or '0')
    return {count == limit + 1 and 'first_limited' or 'limited', v, -1, 'none'}
  end
end

local v = redis.call('HINCRBY', state, 'v', 1)
redis.call('HSET', pending, v, ARGV[3])
-- When the oldest unanswered message arrived: the starvation guard's clock. Only the first
-- message owed sets it; the commit moves it on.
redis.call('HSETNX', state, 'since', now)
-- The user wrote: whatever kept them from our replies (a block, closed DMs) may be over.
redis.call('HDEL', state, 'unreachable')

-- The cap is anchored where the window opened, so a late message can never push it out.
local was_open = redis.call('HGET', window, 'opened')
local opened = tonumber(was_open or now)
if opened > now then
  -- Opened in the future: the clock moved back (a failover to a node behind). Anchored there,
  -- the cap would hold the window open for as long as the clock was behind.
  opened = now
end
local cap = opened + tonumber(ARGV[5])
local deadline = math.min(now + tonumber(ARGV[4]), cap)
redis.call('HSET', window, 'opened', opened, 'deadline', deadline)
redis.call('ZADD', due, deadline, ARGV[1])
-- Lifetimes are renewed by the message that opens a window (and by the commit that answers
-- it): later ones of the same burst, seconds after, would only repeat it, and every key they
-- write already exists with its lifetime (HSET, ZADD, HINCRBY keep it). Seven commands fewer
-- for every message but the first of a burst.
if not was_open then
  keep_alive(retention, state, pending, seen, window, KEYS[8], KEYS[9], KEYS[10])
end
local flag = 'extended'
if not was_open then
  flag = 'opened'
elseif deadline == cap then
  flag = 'capped'
end
return {'accepted', v, math.max(deadline - now, 0), flag}
