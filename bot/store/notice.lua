-- Claim a one-off notice for a conversation: the first claim in the period wins.
-- Returns 1 for the claim that won, 0 otherwise.
local notice = KEYS[1]
local period_ms = tonumber(ARGV[1])
return redis.call('SET', notice, 1, 'NX', 'PX', period_ms) and 1 or 0
