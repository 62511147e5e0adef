-- Whether a recorded call may start now, and mark it started if so: the step that makes a
-- tool with side effects run at most once per call the model asked for, and only while the
-- user's newest word still asks for it.
-- A call already done answers with its result; one found started with no result (its runner
-- died mid-call) runs again only if it has no side effects, else its outcome is 'unknown'
-- for good (the model is told so). Nothing else starts once the user has written since:
-- - 'moved': V is past the version this generation's prompt covered; the generation is stale
--   and hands its lease back, and the next one reads the newer messages;
-- - 'dropped': the call's step was asked for before the version this generation covers (a
--   call held in the window, or queued behind an earlier call of its step, when the user
--   wrote again); it never runs, and the model is asked again with the newer messages.
-- A call with side effects does not start while the burst's window is open and leased to this
-- lease (a speculative generation): the user may still write, and only tools without side
-- effects run before the last word. A deadline further ahead than any window allows is a clock
-- that moved back, and holds nothing.
-- Returns {status, text, error, wait_ms}: status 'run', 'done' (text, error: the result),
-- 'unknown', 'moved', 'dropped', 'hold' (wait_ms: until the window closes), or 'lost' (the
-- lease, or the record, is no longer this generation's)
local lease = KEYS[1]
local tools = KEYS[2]
local window = KEYS[3]
local state = KEYS[4]
local token = ARGV[1]
local fence = ARGV[2]
local turn = ARGV[3]
local call = ARGV[4] -- '<step>:<index in the step>'
local side_effects = ARGV[5] -- '1': the tool changes something outside lastword
local version = ARGV[6] -- the version this generation's prompt covered
local window_bound_ms = tonumber(ARGV[7])
local retention_ms = tonumber(ARGV[8])

local function answer(status, text, error, wait_ms)
  return cjson.encode({status = status, text = text or '', error = error or false,
    wait_ms = wait_ms or 0})
end

if not holds(lease, token, fence) or not redis.call('HGET', tools, 'id:' .. turn) then
  return answer('lost')
end
local field = 'c:' .. turn .. ':' .. call
local found = redis.call('HGET', tools, field)
if found then
  local entry = cjson.decode(found)
  if entry.status == 'done' then
    return answer('done', entry.text, entry.error)
  end
  if entry.status == 'unknown' or side_effects == '1' then
    redis.call('HSET', tools, field, cjson.encode({status = 'unknown'}))
    return answer('unknown')
  end
end
if (redis.call('HGET', state, 'v') or '0') ~= version then
  return answer('moved')
end
local step = string.match(call, '^(%d+):')
if redis.call('HGET', tools, 'v:' .. turn .. ':' .. step) ~= version then
  return answer('dropped')
end
if side_effects == '1' and leased_to(window, fence) then
  local now = now_ms()
  local deadline = tonumber(redis.call('HGET', window, 'deadline') or '0')
  if deadline > now and deadline <= now + window_bound_ms then
    return answer('hold', nil, nil, deadline - now)
  end
end
redis.call('HSET', tools, field, cjson.encode({status = 'started', token = token}))
keep_alive(retention_ms, tools)
return answer('run')
