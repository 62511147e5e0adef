-- Record what a call came to, if the record still holds the start this runner made: the result
-- is true whoever holds the lease now (the tool ran), so a runner that lost its lease still
-- records it, unless the call was already declared 'unknown' to a model or its turn is gone.
-- A call with side effects that timed out, or whose server went away mid-call, ends 'unknown':
-- whether it ran is not known, so it is never run again and the model is told so.
-- Returns 1 if recorded, else 0
local tools = KEYS[1]
local token = ARGV[1]
local turn = ARGV[2]
local call = ARGV[3] -- '<step>:<index in the step>'
local status = ARGV[4] -- 'done' | 'unknown'
local text = ARGV[5]
local error = ARGV[6] -- '1': the call failed
local retention_ms = tonumber(ARGV[7])

if not redis.call('HGET', tools, 'id:' .. turn) then
  return 0
end
local field = 'c:' .. turn .. ':' .. call
local found = redis.call('HGET', tools, field)
if not found or cjson.decode(found).token ~= token then
  return 0
end
if status == 'unknown' then
  redis.call('HSET', tools, field, cjson.encode({status = 'unknown'}))
else
  redis.call('HSET', tools, field, cjson.encode({status = 'done', text = text,
    error = error == '1'}))
end
keep_alive(retention_ms, tools)
return 1
