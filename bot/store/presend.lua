-- The last check before a reply leaves: the lease is still ours and V has not moved.
-- Passing records the reply in the outbox, so a crash after this point resends the same text.
-- Failing drops the reply, leaves W alone and releases the lease; the newer message has
-- already scheduled the cycle that will cover everything. The check is made again after the
-- reply waited its turn in the outbound budget: failing then drops it from the outbox too.
-- A speculative reply (its lease took the window while still open) also waits for the window:
-- while the window is open this answers 'hold', changing nothing; once it has closed, the
-- window is consumed here. A message that came while it was open (and extended it), or the user
-- seen typing meanwhile, restarts the generation: 'restarted' counts no discard and forces
-- nothing out, since no reply went stale.
-- Returns {status, look_in_ms}: status 'ok', 'forced' (stale, but sent by the starvation
-- guard), 'stale' or 'restarted' (look_in_ms: until the next look), 'hold' (look_in_ms: until
-- the window closes) or 'lost' (look_in_ms -1)
local lease = KEYS[1]
local state = KEYS[2]
local outbox = KEYS[3]
local window = KEYS[4]
local due = KEYS[5]
local totals = KEYS[6] -- the shard's totals of today
local conversation = ARGV[1]
local token = ARGV[2]
local fence = ARGV[3]
local version = ARGV[4] -- the version the prompt covered
local text = ARGV[5]
local starvation_limit = tonumber(ARGV[6]) -- discards in a row
local reset = ARGV[7] -- the version of the last /reset among the covered messages (0: none)
local retention_ms = tonumber(ARGV[8])
local starvation_age_ms = tonumber(ARGV[9]) -- 0: off
-- The version of the reply a /retry replaces in the history (0: none); and what the history
-- leaves out: {"message": the /retry message's version (0: none), "said": how many bytes at the
-- end of the text the model said} (commit.lua).
local replaces = ARGV[10]
local unsaid = ARGV[11]
local totals_keep_ms = tonumber(ARGV[12])
-- The admin changes the reply announces (applied after this check, and again by a resend; ''
-- for none).
local changes = ARGV[13]
-- The oldest age the starvation guard trusts (0: the guard's age is off).
local trusted_age_ms = tonumber(ARGV[14])
-- A window deadline further ahead than this is a clock that moved back: taken as passed.
local window_bound_ms = tonumber(ARGV[15])
-- The tool calls the reply made and what they gave, for the history ('' for none).
local tools = ARGV[16]
-- The id of the turn the reply answers (its tool record's: the history keeps it with the reply,
-- so a /retry finds the record again).
local turn = ARGV[17]

local function answer(status, look_in_ms)
  return cjson.encode({status = status, look_in_ms = look_in_ms})
end

if not holds(lease, token, fence) then
  return answer('lost', -1)
end

local status = 'ok'
local speculative = leased_to(window, fence)
local counters = redis.call('HMGET', state, 'v', 'cut')
local current = tonumber(counters[1]) == tonumber(version)
-- The user was seen typing while it ran (typing.lua): restarted, as by a message of its burst.
if speculative and (not current or counters[2] == fence) then
  redis.call('HDEL', window, 'leased')
  redis.call('DEL', lease)
  return answer('restarted', reschedule(state, window, due, conversation, now_ms()))
end
if speculative then
  local now = now_ms()
  local deadline = tonumber(redis.call('HGET', window, 'deadline') or '0')
  if deadline > now and deadline <= now + window_bound_ms then
    return answer('hold', deadline - now)
  end
  -- Closed: consumed, as an acquire at the deadline would have.
  redis.call('DEL', window)
end
if not current then
  local discards = redis.call('HINCRBY', state, 'discards', 1)
  local now = now_ms()
  local waited = now - tonumber(redis.call('HGET', state, 'since') or now)
  -- An age no window allows is the clock's doing (moved forward, or back: in the future), not
  -- the user's: the guard's clock starts again from now rather than force out a stale reply.
  if trusted_age_ms > 0 and (waited < 0 or waited > trusted_age_ms) then
    redis.call('HSET', state, 'since', now)
    waited = 0
  end
  -- Starvation guard: the oldest unanswered message has waited too long, or (the backstop)
  -- too many replies in a row were discarded. Either way this reply goes out as it is.
  local starved = (starvation_age_ms > 0 and waited >= starvation_age_ms)
    or discards > starvation_limit
  if not starved then
    count_today(totals, 'interrupted', totals_keep_ms)
    if redis.call('HGET', outbox, 'fence') == fence then
      redis.call('DEL', outbox)
    end
    redis.call('DEL', lease)
    return answer('stale', reschedule(state, window, due, conversation, now))
  end
  count_today(totals, 'forced', totals_keep_ms)
  status = 'forced'
end
-- The fence and token of this lease stay with the reply: its parts' idempotency keys are made
-- of them, so a resend repeats them and nothing else can (bot/core/cycle.py).
redis.call('HSET', outbox, 'text', text, 'version', version, 'fence', fence, 'reset', reset,
  'token', token, 'replaces', replaces, 'unsaid', unsaid, 'changes', changes, 'tools', tools, 'turn', turn)
keep_alive(retention_ms, outbox)
return answer(status, -1)
