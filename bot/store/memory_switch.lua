-- Set one of a person's memory switches, in their slot (`bot.store.memory`): 'off' (memory
-- kept away from them) or 'groups' (their facts shown in groups too). Kept as long as the
-- facts are. Returns 1
local memory = KEYS[1]
local name = ARGV[1] -- 'off' | 'groups'
local on = ARGV[2] -- '1' | '0'
local keep_ms = tonumber(ARGV[3])
if on == '1' then
  redis.call('HSET', memory, name, 1)
  redis.call('PEXPIRE', memory, keep_ms)
else
  redis.call('HDEL', memory, name)
end
return 1
