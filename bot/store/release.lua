-- Give the lease back without a reply, if it is still ours. A late release from a holder
-- that timed out finds another token and changes nothing.
-- KEYS: lease, state, window, due
-- ARGV: conversation, token
-- Returns {released (0/1), ms until the next look or -1}
if not holds(KEYS[1], ARGV[2], nil) then
  return {0, -1}
end
redis.call('DEL', KEYS[1])
return {1, reschedule(KEYS[2], KEYS[3], KEYS[4], ARGV[1], now_ms())}
