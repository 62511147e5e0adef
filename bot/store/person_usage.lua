-- Add the tokens one reply cost to its person's day and month, in the person's slot: what the
-- daily budget is checked against and /usage shows, wherever the person asks. Weighed by the
-- model's cost (tokens) and as spent (prompt, completion), as usage.lua keeps a place's share.
-- Returns the weighed tokens the person spent on the day so far.
local day = KEYS[1]
local month = KEYS[2]
local prompt = tonumber(ARGV[1]) -- tokens
local completion = tonumber(ARGV[2])
local cost = tonumber(ARGV[3]) -- the model's cost factor
local day_keep_ms = tonumber(ARGV[4])
local month_keep_ms = tonumber(ARGV[5])
return add_spent(day, month, prompt, completion, cost, day_keep_ms, month_keep_ms)
