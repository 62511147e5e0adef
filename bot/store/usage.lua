-- Add the tokens one reply cost to the conversation's totals and to its user's day.
-- KEYS: usage, day
-- ARGV: prompt tokens, completion tokens, user id, day ttl ms
-- Returns the tokens spent on the day so far.
local usage, day = KEYS[1], KEYS[2]
local prompt, completion = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('HINCRBY', usage, 'prompt', prompt)
redis.call('HINCRBY', usage, 'completion', completion)
redis.call('HINCRBY', usage, 'replies', 1)
redis.call('HSET', usage, 'user', ARGV[3])
local spent = redis.call('HINCRBY', day, 'tokens', prompt + completion)
redis.call('PEXPIRE', day, tonumber(ARGV[4]))
return spent
