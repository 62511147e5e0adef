-- An admin's change to one user's access (/allow, /deny) or daily budget (/budget), merged
-- into the user's record with who made it, when, and a sequence number that orders it after
-- every earlier change: the record's copies in the shards are never replaced by an older one
-- (access_copy).
-- The seq is above the last one handed out and never below the server's time in ms: should a
-- failover lose this slot (the counter with it) while the shards' copies survive, a new change
-- still outnumbers every copy made before, instead of being taken for an older one and kept out.
-- KEYS: records, sequence
-- ARGV: user id, field ('access' or 'budget'), value ('' clears the field), admin's user id
-- Returns {the user's record as json, the seq handed out before this one (0: none)}
local records, sequence = KEYS[1], KEYS[2]
local held = redis.call('HGET', records, ARGV[1])
local record = held and cjson.decode(held) or {}
local value = ARGV[3]
if value == '' then
  value = nil
elseif ARGV[2] == 'budget' then
  value = tonumber(value)
end
local now = now_ms()
local previous = tonumber(redis.call('GET', sequence) or '0')
local seq = math.max(previous + 1, now)
redis.call('SET', sequence, string.format('%d', seq))
record[ARGV[2]] = value
record.by = ARGV[4]
record.at = now
record.seq = seq
local encoded = cjson.encode(record)
redis.call('HSET', records, ARGV[1], encoded)
return {encoded, previous}
