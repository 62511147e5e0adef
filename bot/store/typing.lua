-- The user is typing (a platform's typing signal, as `Runtime.user_typing` passes it on): hold
-- their open window as a message would, without changing V. The window then closes `hold_ms`
-- after the signal (as long as the platform's signal lasts), or after the next message's own
-- window, and never past its cap (max_wait from its opening). A speculative generation running
-- on it is cut: its lease's fence is noted as 'cut', which its holder's version watch and the
-- pre-send check read as a message of its own burst (restarted, no discard). Speculation waits
-- for the next message. A signal when no window is open (none owed, or the window has closed
-- and its burst is being answered, or a clock that moved back left it far ahead) changes
-- nothing but the time noted, which the next message's learned window reads (ingest.lua).
-- Bounded like messages: a signal within `every_ms` of the one before, with no message between
-- them, is dropped; and one from a user with no conversation writes nothing at all.
-- Returns {status = 'held' (look_in_ms: until the new deadline; cut: the fence cut, or 0) |
-- 'noted' | 'dropped'}
local state = KEYS[1]
local window = KEYS[2]
local due = KEYS[3]
local conversation = ARGV[1]
local hold_ms = tonumber(ARGV[2])
local max_wait_ms = tonumber(ARGV[3])
local every_ms = tonumber(ARGV[4])
-- A window deadline further ahead than this is a clock that moved back: taken as passed.
local window_bound_ms = tonumber(ARGV[5])
local now = now_ms()

if redis.call('EXISTS', state) == 0 then
  return cjson.encode({status = 'dropped'})
end
local times = redis.call('HMGET', state, 'typed_at', 'last_at')
local typed_at, last_at = tonumber(times[1] or '0'), tonumber(times[2] or '0')
if typed_at >= last_at and typed_at > 0 and now >= typed_at and now - typed_at < every_ms then
  return cjson.encode({status = 'dropped'})
end
redis.call('HSET', state, 'typed_at', now)

local open = redis.call('HMGET', window, 'opened', 'deadline', 'leased')
local opened, deadline = tonumber(open[1] or '0'), tonumber(open[2] or '0')
if deadline <= now or deadline > now + window_bound_ms then
  return cjson.encode({status = 'noted'})
end
-- As in ingest.lua: a window opened in the future is a clock that moved back.
local cap = math.min(opened, now) + max_wait_ms
local held = math.min(math.max(deadline, now + hold_ms), cap)
redis.call('HSET', window, 'deadline', held, 'speculate_at', 0)
local cut = 0
if open[3] then
  -- Its holder hands the lease back once cut (interrupt.lua reschedules then): the due-index
  -- keeps the lease's expiry meanwhile, in case it died.
  cut = tonumber(open[3])
  redis.call('HSET', state, 'cut', cut)
else
  redis.call('ZADD', due, held, conversation)
end
-- The burst's trace, tracing on ('' otherwise): the hold joins it (bot.traces).
return cjson.encode({status = 'held', look_in_ms = held - now, cut = cut,
  trace = redis.call('HGET', state, 'trace') or ''})
