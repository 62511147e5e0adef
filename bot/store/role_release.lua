-- Give a role back, if it is still ours, so another replica can take it at once instead of
-- waiting for the expiry. A late release from a holder that lost it changes nothing.
-- Returns 1 if released, 0 if it was not ours.
local role = KEYS[1]
local token = ARGV[1]
if not holds(role, token, nil) then
  return 0
end
redis.call('DEL', role)
return 1
