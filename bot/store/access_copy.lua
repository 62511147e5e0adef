-- Copy users' access records into one shard, each unless the shard holds a newer one already:
-- two admins' changes copied at once leave every shard with the later of them. The shard notes
-- the seq up to which it holds every change (field `~seq`, no user id can be one), so the sweep
-- can tell a shard that lags behind `{lw:access}` with one read (due).
-- ARGV past the named ones: (user id, record json, its seq) for each record.
-- Returns the number of records copied
local shard = KEYS[1] -- the shard's access hash
-- The shard holds every change up to whole_after once these are copied, if it held every
-- change up to whole_before before (a change: its own seq and the one handed out before it;
-- mending from a full read: the seq read before the records, and 0).
local whole_after = ARGV[1] -- kept as text: written back as it came
local whole_before = tonumber(ARGV[2])
local copied = 0
for i = 3, #ARGV, 3 do
  local held = redis.call('HGET', shard, ARGV[i])
  if not (held and tonumber(cjson.decode(held).seq) >= tonumber(ARGV[i + 2])) then
    redis.call('HSET', shard, ARGV[i], ARGV[i + 1])
    copied = copied + 1
  end
end
-- Only a chain without a gap makes the shard whole: of two changes copied out of order, the
-- later one alone proves nothing about the earlier, and the sweep mends the shard instead.
local whole = tonumber(redis.call('HGET', shard, '~seq') or '0')
if whole >= whole_before and tonumber(whole_after) > whole then
  redis.call('HSET', shard, '~seq', whole_after)
end
return copied
