-- Record a call's result, if the record still holds the start this runner made: the result is
-- true whoever holds the lease now (the tool ran), so a runner that lost its lease still
-- records it, unless the call was already declared 'unknown' to a model or its burst is gone.
-- Returns 1 if recorded, else 0
local tools = KEYS[1]
local token = ARGV[1]
local burst = ARGV[2]
local call = ARGV[3] -- '<step>:<index in the step>'
local text = ARGV[4]
local error = ARGV[5] -- '1': the call failed
local retention_ms = tonumber(ARGV[6])

if redis.call('HGET', tools, 'burst') ~= burst then
  return 0
end
local field = 'c:' .. call
local found = redis.call('HGET', tools, field)
if not found or cjson.decode(found).token ~= token then
  return 0
end
redis.call('HSET', tools, field, cjson.encode({status = 'done', text = text, error = error == '1'}))
keep_alive(retention_ms, tools)
return 1
