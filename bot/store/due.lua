-- Conversations in one shard of the due-index whose next look is at or before now, and those
-- scored further ahead than any delay the flow sets (a clock that moved back, after a failover
-- to a node behind, left them there: waiting for it to catch up would hold them for as long
-- as it was behind). Also the seq up to which the shard holds every access change, for the
-- sweep to mend a shard that lags behind `{lw:access}` (access_copy).
-- Returns {found = the conversations, whole = the shard's access seq}
local due = KEYS[1]
local access = KEYS[2] -- the shard's access hash
local limit = tonumber(ARGV[1])
local horizon_ms = tonumber(ARGV[2]) -- the longest delay the flow sets, with slack
local now = now_ms()
local found = redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, limit)
if #found < limit then
  local horizon = now + horizon_ms
  local beyond = redis.call('ZRANGEBYSCORE', due, '(' .. string.format('%d', horizon), '+inf',
    'LIMIT', 0, limit - #found)
  for _, conversation in ipairs(beyond) do
    found[#found + 1] = conversation
  end
end
local whole = redis.call('HGET', access, '~seq') or '0'
return cjson.encode({found = found, whole = whole})
