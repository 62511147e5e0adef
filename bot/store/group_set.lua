-- An admin's /allow or /deny of a group, from inside it: kept in the group's own key (in its
-- chat's shard, which ingest.lua reads with each message there), overriding the settings.
local group = KEYS[1]
local allowed = ARGV[1] -- '1' allow, '0' deny
local by = ARGV[2] -- the admin
redis.call('HSET', group, 'allowed', allowed, 'by', by, 'at', now_ms())
return 1
