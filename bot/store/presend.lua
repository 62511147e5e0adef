-- The last check before a reply leaves: the lease is still ours and V has not moved.
-- Passing records the reply in the outbox, so a crash after this point resends the same text.
-- Failing drops the reply, leaves W alone and releases the lease; the newer message has
-- already scheduled the cycle that will cover everything.
-- KEYS: lease, state, outbox, window, due, the shard's totals of today
-- ARGV: conversation, token, fence, version the prompt covered, reply text, starvation limit
--       (discards in a row), version of the last /reset among the covered messages (0: none),
--       retention ms, starvation age ms (0: off), version of the reply a /retry replaces in
--       the history (0: none), version of the /retry message itself (kept out of the history),
--       totals keep ms, the admin changes the reply announces (applied after this check, and
--       again by a resend; '' for none), the oldest age the starvation guard trusts in ms
--       (0: the guard's age is off)
-- Returns {'ok'} | {'forced'} (stale, but sent by the starvation guard)
--       | {'stale', ms until the next look} | {'lost', -1}
local lease, state, outbox, window, due = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
if not holds(lease, ARGV[2], ARGV[3]) then
  return {'lost', -1}
end

local status = 'ok'
if tonumber(redis.call('HGET', state, 'v')) ~= tonumber(ARGV[4]) then
  local discards = redis.call('HINCRBY', state, 'discards', 1)
  local now = now_ms()
  local age = tonumber(ARGV[9])
  local waited = now - tonumber(redis.call('HGET', state, 'since') or now)
  -- An age no window allows is the clock's doing (moved forward, or back: in the future), not
  -- the user's: the guard's clock starts again from now rather than force out a stale reply.
  local trusted = tonumber(ARGV[14])
  if trusted > 0 and (waited < 0 or waited > trusted) then
    redis.call('HSET', state, 'since', now)
    waited = 0
  end
  -- Starvation guard: the oldest unanswered message has waited too long, or (the backstop)
  -- too many replies in a row were discarded. Either way this reply goes out as it is.
  local starved = (age > 0 and waited >= age) or discards > tonumber(ARGV[6])
  if not starved then
    count_today(KEYS[6], 'interrupted', tonumber(ARGV[12]))
    redis.call('DEL', lease)
    return {'stale', reschedule(state, window, due, ARGV[1], now)}
  end
  count_today(KEYS[6], 'forced', tonumber(ARGV[12]))
  status = 'forced'
end
-- The fence and token of this lease stay with the reply: its parts' idempotency keys are made
-- of them, so a resend repeats them and nothing else can (bot/cycle.py).
redis.call('HSET', outbox, 'text', ARGV[5], 'version', ARGV[4], 'fence', ARGV[3], 'reset', ARGV[7],
  'token', ARGV[2], 'replaces', ARGV[10], 'unsaid', ARGV[11], 'changes', ARGV[13])
keep_alive(tonumber(ARGV[8]), outbox)
return {status}
