-- An admin's change to one user's access (/allow, /deny) or daily budget (/budget), merged
-- into the user's record with who made it, when, and a sequence number that orders it after
-- every earlier change: the record's copies in the shards are never replaced by an older one
-- (access_copy).
-- The seq is above the last one handed out and never below the server's time in ms: should a
-- failover lose this slot (the counter with it) while the shards' copies survive, a new change
-- still outnumbers every copy made before, instead of being taken for an older one and kept out.
-- Returns {record = the user's record as json, previous = the seq handed out before this one
-- ('0': none)}
local records = KEYS[1]
local sequence = KEYS[2]
local user = ARGV[1]
local field = ARGV[2] -- 'access' or 'budget'
local value = ARGV[3] -- '' clears the field
local by = ARGV[4] -- the admin's user id
local held = redis.call('HGET', records, user)
local record = held and cjson.decode(held) or {}
if value == '' then
  value = nil
elseif field == 'budget' then
  value = tonumber(value)
end
local now = now_ms()
local previous = tonumber(redis.call('GET', sequence) or '0')
local seq = math.max(previous + 1, now)
redis.call('SET', sequence, string.format('%d', seq))
record[field] = value
record.by = by
record.at = now
record.seq = seq
local encoded = cjson.encode(record)
redis.call('HSET', records, user, encoded)
-- The seq as text: it is a time in ms, more digits than cjson writes a number with.
return cjson.encode({record = encoded, previous = string.format('%d', previous)})
