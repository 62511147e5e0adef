-- Copy a user's access record into one shard, unless the shard holds a newer one already:
-- two admins' changes copied at once leave every shard with the later of them.
-- KEYS: the shard's access hash
-- ARGV: user id, record json, its seq
-- Returns 'copied' | 'kept'
local held = redis.call('HGET', KEYS[1], ARGV[1])
if held and tonumber(cjson.decode(held).seq) >= tonumber(ARGV[3]) then
  return 'kept'
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 'copied'
