-- A group that moved to a new chat (a Telegram group upgraded to a supergroup): the new chat's
-- group key (in its own shard, which ingest.lua reads with each message there) takes the old
-- group's allowance, as the caller read it from the old chat's shard and the settings. An
-- admin's /allow or /deny said in the new chat already wins: it is left as it is.
local group = KEYS[1]
local allowed = ARGV[1] -- '1' allow, '0' deny
local from = ARGV[2] -- the old chat
if redis.call('HEXISTS', group, 'allowed') == 1 then
  return 0
end
redis.call('HSET', group, 'allowed', allowed, 'by', 'moved from ' .. from, 'at', now_ms())
return 1
