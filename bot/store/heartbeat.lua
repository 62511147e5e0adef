-- A replica's heartbeat, in one step on the server's clock: the beat time never comes from the
-- replica's clock, and the start time survives the key expiring during an outage (the caller
-- passes it back). The hash is rewritten whole, so fields the replica no longer reports go.
-- KEYS: heartbeat
-- ARGV: ttl ms, started_at ms ('' = keep the recorded one, or now), then field, value pairs
-- Returns started_at.
local now = now_ms()
local started = ARGV[2]
if started == '' then
  started = redis.call('HGET', KEYS[1], 'started_at') or string.format('%d', now)
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'started_at', started, 'last_beat', string.format('%d', now),
  unpack(ARGV, 3))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
return tonumber(started)
