-- An admin's change to one user's access (/allow, /deny) or daily budget (/budget), merged
-- into the user's record with who made it, when, and a sequence number that orders it after
-- every earlier change: the record's copies in the shards are never replaced by an older one
-- (access_copy).
-- KEYS: records, sequence
-- ARGV: user id, field ('access' or 'budget'), value ('' clears the field), admin's user id
-- Returns the user's record, as json
local records, sequence = KEYS[1], KEYS[2]
local held = redis.call('HGET', records, ARGV[1])
local record = held and cjson.decode(held) or {}
local value = ARGV[3]
if value == '' then
  value = nil
elseif ARGV[2] == 'budget' then
  value = tonumber(value)
end
record[ARGV[2]] = value
record.by = ARGV[4]
record.at = now_ms()
record.seq = redis.call('INCR', sequence)
local encoded = cjson.encode(record)
redis.call('HSET', records, ARGV[1], encoded)
return encoded
