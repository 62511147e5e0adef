-- Record the tool calls one model step asked for, in the turn's record, before any of them
-- runs: a later generation of the same burst (after an interrupt, a /retry, a takeover by
-- another replica) resumes from the record instead of asking the model, and running, anew.
-- The record holds one burst at a time (field 'burst': its first version); a step of another
-- burst replaces it, as that burst has been answered. Checked against the lease's token and
-- fence, so a holder that lost its lease records nothing.
-- Returns 1, or 0 if the lease is no longer ours
local lease = KEYS[1]
local tools = KEYS[2]
local token = ARGV[1]
local fence = ARGV[2]
local burst = ARGV[3] -- the first version of the burst the calls are for
local step = tonumber(ARGV[4]) -- counted from 0 within the burst
local calls = ARGV[5] -- json: [{id, name, arguments}]
local retention_ms = tonumber(ARGV[6])

if not holds(lease, token, fence) then
  return 0
end
if redis.call('HGET', tools, 'burst') ~= burst then
  redis.call('DEL', tools)
  redis.call('HSET', tools, 'burst', burst)
end
-- Steps are recorded in order: a later step replaces the tail a cut-short generation left.
for k = step, tonumber(redis.call('HGET', tools, 'steps') or '0') - 1 do
  redis.call('HDEL', tools, 's:' .. k)
end
redis.call('HSET', tools, 's:' .. step, calls, 'steps', step + 1)
keep_alive(retention_ms, tools)
return 1
