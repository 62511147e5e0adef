-- Conversations in shards of the due-index whose next look is at or before now, and those
-- scored further ahead than any delay the flow sets (a clock that moved back, after a failover
-- to a node behind, left them there: waiting for it to catch up would hold them for as long
-- as it was behind). Also the seq up to which each shard holds every access change, for the
-- sweep to mend a shard that lags behind `{lw:access}` (access_copy).
-- One shard's keys, or on a single server every shard's: KEYS past the named ones are further
-- shards' (due, access) pairs, read the same way.
-- Returns, for each shard in the order given, {found = the conversations, whole = its seq}
local due = KEYS[1]
local access = KEYS[2] -- the shard's access hash
local limit = tonumber(ARGV[1])
local horizon_ms = tonumber(ARGV[2]) -- the longest delay the flow sets, with slack
local now = now_ms()

local function look(due_key, access_key)
  local found = redis.call('ZRANGEBYSCORE', due_key, '-inf', now, 'LIMIT', 0, limit)
  if #found < limit then
    local horizon = now + horizon_ms
    local beyond = redis.call('ZRANGEBYSCORE', due_key, '(' .. string.format('%d', horizon),
      '+inf', 'LIMIT', 0, limit - #found)
    for _, conversation in ipairs(beyond) do
      found[#found + 1] = conversation
    end
  end
  return {found = found, whole = redis.call('HGET', access_key, '~seq') or '0'}
end

local shards = {look(due, access)}
for i = 3, #KEYS, 2 do
  shards[#shards + 1] = look(KEYS[i], KEYS[i + 1])
end
return cjson.encode(shards)
