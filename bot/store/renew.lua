-- Extend our lease, if it is still ours (token and fence both match).
-- KEYS: lease, due
-- ARGV: conversation, token, fence, ttl ms
-- Returns 1 if renewed, 0 if the lease is no longer ours.
if not holds(KEYS[1], ARGV[2], ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[1], 'ttl', ARGV[4])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]))
redis.call('ZADD', KEYS[2], now_ms() + tonumber(ARGV[4]), ARGV[1])
return 1
