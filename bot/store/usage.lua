-- Add the tokens one reply cost to the conversation's totals, to its user's day, and to the
-- shard's day (totals, and the conversations ranked by tokens) that `lastword status` reads.
-- KEYS: usage, day, shard day totals, shard day ranking, month
-- ARGV: prompt tokens, completion tokens, user id, day ttl ms, conversation, retention ms,
--       month ttl ms, cost factor of the model (weighs the user's day and month)
-- Returns the tokens spent on the day so far.
local usage, day, totals, ranking = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prompt, completion = tonumber(ARGV[1]), tonumber(ARGV[2])
local keep = tonumber(ARGV[4])
redis.call('HINCRBY', usage, 'prompt', prompt)
redis.call('HINCRBY', usage, 'completion', completion)
redis.call('HINCRBY', usage, 'replies', 1)
redis.call('HSET', usage, 'user', ARGV[3])
keep_alive(tonumber(ARGV[6]), usage)
redis.call('HINCRBY', totals, 'prompt', prompt)
redis.call('HINCRBY', totals, 'completion', completion)
redis.call('HINCRBY', totals, 'generations', 1)
redis.call('ZINCRBY', ranking, prompt + completion, ARGV[5])
redis.call('PEXPIRE', totals, keep)
redis.call('PEXPIRE', ranking, keep)
local weighed = math.floor((prompt + completion) * tonumber(ARGV[8]) + 0.5)
local spent = redis.call('HINCRBY', day, 'tokens', weighed)
redis.call('PEXPIRE', day, keep)
redis.call('HINCRBY', KEYS[5], 'tokens', weighed)
redis.call('PEXPIRE', KEYS[5], tonumber(ARGV[7]))
return spent
