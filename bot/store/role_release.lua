-- Give a role back, if it is still ours, so another replica can take it at once instead of
-- waiting for the expiry. A late release from a holder that lost it changes nothing.
-- KEYS: role
-- ARGV: token
-- Returns 1 if released, 0 if it was not ours.
if not holds(KEYS[1], ARGV[1], nil) then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
