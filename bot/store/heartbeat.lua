-- A replica's heartbeat, in one step on the server's clock: the beat time never comes from the
-- replica's clock, and the start time survives the key expiring during an outage (the caller
-- passes it back). The hash is rewritten whole, so fields the replica no longer reports go.
-- ARGV past the named ones: field, value pairs.
-- Returns started_at.
local heartbeat = KEYS[1]
local ttl_ms = tonumber(ARGV[1])
local started_at = ARGV[2] -- ms; '' = keep the recorded one, or now
local now = now_ms()
if started_at == '' then
  started_at = redis.call('HGET', heartbeat, 'started_at') or string.format('%d', now)
end
redis.call('DEL', heartbeat)
redis.call('HSET', heartbeat, 'started_at', started_at, 'last_beat', string.format('%d', now),
  unpack(ARGV, 3))
redis.call('PEXPIRE', heartbeat, ttl_ms)
return tonumber(started_at)
