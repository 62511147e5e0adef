-- /persona: keep the user's own instructions for their conversation, or drop them ('').
-- Returns 1
local state = KEYS[1]
local persona = ARGV[1] -- the instructions, '' to drop them
if persona == '' then
  redis.call('HDEL', state, 'persona')
elseif redis.call('EXISTS', state) == 1 then
  -- Only on a live conversation: a field set on a missing key would keep it for ever.
  redis.call('HSET', state, 'persona', persona)
end
return 1
