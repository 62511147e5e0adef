-- The platform answered a 429: the scope grants nothing to any replica for `hold_ms`. A hold
-- only grows: a shorter retry_after, heard later, never cuts a longer one short.
-- `holds` lists the scopes held, each with when its hold ends, for `lastword status`; `heard`
-- counts the 429s and the ms held by the kind of scope, for every replica to read.
-- A platform that does not say what a 429 is about (Telegram) has it pinned on the call's own
-- chat (`spread` '1'): one chat refused means that chat is flooded, but `spread_count` chats
-- refused within `spread_ms` mean the bot as a whole is, and the bot's scope is held too.
local hold = KEYS[1]
local holds = KEYS[2]
local heard = KEYS[3]
local recent = KEYS[4] -- the scopes a guessed 429 named lately, each with when
local bot_hold = KEYS[5]
local scope = ARGV[1]
local hold_ms = tonumber(ARGV[2])
local spread = ARGV[3] -- '1': the platform did not say what the 429 is about
local spread_count = tonumber(ARGV[4])
local spread_ms = tonumber(ARGV[5])
local bot_scope = ARGV[6]
local heard_keep_ms = tonumber(ARGV[7])

local now = now_ms()
local hold_until = now + hold_ms

-- Hold `key` (the scope `name`'s) until hold_until, counting the 429 and the time it adds.
local function held(key, name)
  local kind = name:match('^[^:]*')
  redis.call('HINCRBY', heard, kind .. ':count', 1)
  local was = math.max(tonumber(redis.call('GET', key) or '0'), now)
  if was >= hold_until then
    return
  end
  redis.call('HINCRBY', heard, kind .. ':held_ms', hold_until - was)
  redis.call('SET', key, hold_until, 'PX', hold_ms)
  redis.call('ZADD', holds, hold_until, name)
  if redis.call('PTTL', holds) < hold_ms then
    redis.call('PEXPIRE', holds, hold_ms)
  end
end

held(hold, scope)
local widened = false
if spread == '1' and scope ~= bot_scope then
  redis.call('ZADD', recent, now, scope)
  redis.call('ZREMRANGEBYSCORE', recent, '-inf', now - spread_ms)
  redis.call('PEXPIRE', recent, spread_ms)
  if redis.call('ZCARD', recent) >= spread_count then
    held(bot_hold, bot_scope)
    widened = true
  end
end
redis.call('PEXPIRE', heard, heard_keep_ms)
return cjson.encode({hold_until = hold_until, widened = widened})
