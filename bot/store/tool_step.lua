-- Record the tool calls one model step asked for, in the turn's record, before any of them
-- runs: a later generation of the same turn (after an interrupt, a /retry, a takeover by
-- another replica) resumes from the record instead of asking the model, and running, anew.
-- The record holds one turn at a time (field 'burst': the turn's id, the first version of the
-- burst it was made for); a step of another turn replaces it, as that turn has been answered.
-- A record is born with a random id of the caller's making: the calls' idempotency keys carry
-- it, so no key is ever given to two different calls, even after V starts again from 0.
-- Each step keeps the version its prompt covered ('v:<step>'): a call of a step asked for
-- before the user's newest word never starts (tool_begin.lua). Checked against the lease's
-- token and fence, so a holder that lost its lease records nothing.
-- Returns the record's id, or '' if the lease is no longer ours
local lease = KEYS[1]
local tools = KEYS[2]
local token = ARGV[1]
local fence = ARGV[2]
local burst = ARGV[3] -- the id of the turn the calls are for
local step = tonumber(ARGV[4]) -- counted from 0 within the turn
local calls = ARGV[5] -- json: [{id, name, arguments, tool}]
local version = ARGV[6] -- the version the step's prompt covered
local id = ARGV[7] -- the record's id, if it is born now
local retention_ms = tonumber(ARGV[8])

if not holds(lease, token, fence) then
  return ''
end
if redis.call('HGET', tools, 'burst') ~= burst then
  redis.call('DEL', tools)
  redis.call('HSET', tools, 'burst', burst, 'id', id)
end
-- Steps are recorded in order: a later step replaces the tail a cut-short generation left.
for k = step, tonumber(redis.call('HGET', tools, 'steps') or '0') - 1 do
  redis.call('HDEL', tools, 's:' .. k, 'v:' .. k)
  for _, field in ipairs(redis.call('HKEYS', tools)) do
    if string.sub(field, 1, #('c:' .. k .. ':')) == 'c:' .. k .. ':' then
      redis.call('HDEL', tools, field)
    end
  end
end
redis.call('HSET', tools, 's:' .. step, calls, 'v:' .. step, version, 'steps', step + 1)
keep_alive(retention_ms, tools)
return redis.call('HGET', tools, 'id')
