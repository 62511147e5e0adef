-- Add the tokens one reply cost to the conversation's totals, to its day and month, and to the
-- shard's day (totals, and the conversations ranked by tokens) that `lastword status` reads.
-- The conversation's day and month are the place's share of its person's (person_usage.lua
-- counts those, which the daily budget is checked against), as spent (prompt, completion)
-- and weighed by the model's cost (tokens).
-- Returns the weighed tokens spent on the day so far.
local usage = KEYS[1]
local day = KEYS[2]
local totals = KEYS[3] -- the shard's day totals
local ranking = KEYS[4] -- the shard's day ranking
local month = KEYS[5]
local prompt = tonumber(ARGV[1]) -- tokens
local completion = tonumber(ARGV[2])
local user = ARGV[3]
local day_keep_ms = tonumber(ARGV[4])
local conversation = ARGV[5]
local retention_ms = tonumber(ARGV[6])
local month_keep_ms = tonumber(ARGV[7])
local cost = tonumber(ARGV[8]) -- the model's cost factor: weighs the user's day and month
redis.call('HINCRBY', usage, 'prompt', prompt)
redis.call('HINCRBY', usage, 'completion', completion)
redis.call('HINCRBY', usage, 'replies', 1)
redis.call('HSET', usage, 'user', user)
keep_alive(retention_ms, usage)
redis.call('HINCRBY', totals, 'prompt', prompt)
redis.call('HINCRBY', totals, 'completion', completion)
redis.call('HINCRBY', totals, 'generations', 1)
redis.call('ZINCRBY', ranking, prompt + completion, conversation)
redis.call('PEXPIRE', totals, day_keep_ms)
redis.call('PEXPIRE', ranking, day_keep_ms)
return add_spent(day, month, prompt, completion, cost, day_keep_ms, month_keep_ms)
