-- Claim a one-off notice for a conversation: the first claim in the period wins.
-- KEYS: notice
-- ARGV: period ms
-- Returns 1 for the claim that won, 0 otherwise.
return redis.call('SET', KEYS[1], 1, 'NX', 'PX', tonumber(ARGV[1])) and 1 or 0
