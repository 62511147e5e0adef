-- Conversations in one shard of the due-index whose next look is at or before now.
-- KEYS: due
-- ARGV: limit
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms(), 'LIMIT', 0, tonumber(ARGV[1]))
