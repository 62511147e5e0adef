-- Cache a file's transcript (or a document's text) for the conversation's retention, and name
-- it in the conversation's index of cached files, so /forget finds every one without a SCAN.
-- The cached entry of file key F is the index's own name, ':', then F (`Keys.transcript`).
-- Returns 1
local transcript = KEYS[1]
local heard = KEYS[2] -- the index: file key -> when its entry expires (ms, server clock)
local file_key = ARGV[1]
local text = ARGV[2]
local retention_ms = tonumber(ARGV[3])
local now = now_ms()
redis.call('SET', transcript, text, 'PX', retention_ms)
-- Entries expired since leave the index: it names no more files than the cache holds.
redis.call('ZREMRANGEBYSCORE', heard, '-inf', now)
redis.call('ZADD', heard, now + retention_ms, file_key)
-- The index outlives none of its entries by much, and none outlives it: a shorter retention
-- configured since leaves the longer lifetime an earlier entry gave it.
if redis.call('PTTL', heard) < retention_ms then
  redis.call('PEXPIRE', heard, retention_ms)
end
return 1
