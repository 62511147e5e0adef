-- Whether a recorded call may run now, and mark it started if so: the step that makes a tool
-- with side effects run at most once per call the model asked for.
-- A call already done answers with its result; one found started with no result (its runner
-- died mid-call) runs again only if it has no side effects, else its outcome is 'unknown'
-- for good (the model is told so). A call with side effects does not start while the burst's
-- window is open and leased to this lease (a speculative generation): the user may still
-- write, and only tools without side effects run before the last word.
-- Returns {status, text, error, wait_ms}: status 'run', 'done' (text, error: the result),
-- 'unknown', 'hold' (wait_ms: until the window closes), or 'lost' (the lease, or the record,
-- is no longer this generation's)
local lease = KEYS[1]
local tools = KEYS[2]
local window = KEYS[3]
local token = ARGV[1]
local fence = ARGV[2]
local burst = ARGV[3]
local call = ARGV[4] -- '<step>:<index in the step>'
local side_effects = ARGV[5] -- '1': the tool changes something outside lastword
local window_bound_ms = tonumber(ARGV[6])
local retention_ms = tonumber(ARGV[7])

local function answer(status, text, error, wait_ms)
  return cjson.encode({status = status, text = text or '', error = error or false,
    wait_ms = wait_ms or 0})
end

if not holds(lease, token, fence) or redis.call('HGET', tools, 'burst') ~= burst then
  return answer('lost')
end
local field = 'c:' .. call
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
