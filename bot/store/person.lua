-- A person's step at ingest, in their slot, for a message said anywhere but their home DM
-- (whose ingest counts the same counter itself): note the place in the index of their places,
-- so /forget finds it, and, if the message may reach the model, count it against the person's
-- rate, which every place shares. A message counted already in this window is not counted
-- again: its ingest, in another slot, failed after this step (that slot's node down) and was
-- retried, maybe many times, and an outage must not use up the person's rate.
-- Returns 'ok', 'limited' (over the rate) or 'first_limited' (over it, and the first such in
-- its window: the person is told once)
local rate = KEYS[1]
local places = KEYS[2] -- conversation -> when the person last spoke there (ms, server clock)
local counted = KEYS[3] -- "<place>\n<message id>" -> 1: what this window counted and let in
local place = ARGV[1] -- the conversation the message was said in
local message_id = ARGV[2] -- '' for none (it is then counted however often it comes)
local counts = ARGV[3] -- '1': it may reach the model, so it counts against the rate
local rate_limit = tonumber(ARGV[4]) -- messages allowed per rate window (0: no limit)
local rate_window_ms = tonumber(ARGV[5])
local places_cap = tonumber(ARGV[6])
local keep_ms = tonumber(ARGV[7]) -- the conversations' retention: a place is kept as long
local now = now_ms()
redis.call('ZADD', places, now, place)
-- Bounded by age and by count: a place older than the retention has nothing left to erase,
-- and past the cap the places spoken in longest ago go first.
redis.call('ZREMRANGEBYSCORE', places, '-inf', now - keep_ms)
redis.call('ZREMRANGEBYRANK', places, 0, -(places_cap + 1))
redis.call('PEXPIRE', places, keep_ms)
if counts ~= '1' or rate_limit <= 0 then
  return 'ok'
end
local said = place .. '\n' .. message_id
if message_id ~= '' and redis.call('HEXISTS', counted, said) == 1 then
  return 'ok'
end
local count = redis.call('INCR', rate)
if count == 1 then
  redis.call('PEXPIRE', rate, rate_window_ms)
  -- A new window: what the last one counted is forgotten with it.
  redis.call('DEL', counted)
end
if count > rate_limit then
  -- Not remembered: a refused message asked again is refused again, and the hash stays as
  -- small as the rate (at most `rate_limit` entries a window, whatever a flood sends).
  return count == rate_limit + 1 and 'first_limited' or 'limited'
end
if message_id ~= '' then
  redis.call('HSET', counted, said, 1)
  redis.call('PEXPIRE', counted, math.max(redis.call('PTTL', rate), 1))
end
return 'ok'
