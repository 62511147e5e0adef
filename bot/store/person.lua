-- A person's step at ingest, in their slot, for a message said anywhere but their home DM
-- (whose ingest counts the same counter itself): note the place in the index of their places,
-- so /forget finds it, and, if the message may reach the model, count it against the person's
-- rate, which every place shares.
-- Returns 'ok', 'limited' (over the rate) or 'first_limited' (over it, and the first such in
-- its window: the person is told once)
local rate = KEYS[1]
local places = KEYS[2] -- conversation -> when the person last spoke there (ms, server clock)
local place = ARGV[1] -- the conversation the message was said in
local counts = ARGV[2] -- '1': it may reach the model, so it counts against the rate
local rate_limit = tonumber(ARGV[3]) -- messages allowed per rate window (0: no limit)
local rate_window_ms = tonumber(ARGV[4])
local places_cap = tonumber(ARGV[5])
local keep_ms = tonumber(ARGV[6]) -- the conversations' retention: a place is kept as long
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
local count = redis.call('INCR', rate)
if count == 1 then
  redis.call('PEXPIRE', rate, rate_window_ms)
end
if count > rate_limit then
  return count == rate_limit + 1 and 'first_limited' or 'limited'
end
return 'ok'
