-- Keep a fact for a person, in their slot (`bot.store.memory`): a new one, or one rewritten
-- (`replace`). A write names itself (`key`: the tool call's idempotency key, or a /remember's
-- place and version), and the same key again changes nothing, so a write carried out twice
-- (a reply re-sent after a crash) keeps one fact. At `cap` facts a new one is refused
-- ('full'), or with `evict` takes the place of the least recently written.
-- Returns {status, n, evicted} as JSON; status: saved | replaced | exists | full | missing
local memory = KEYS[1] -- next (the last number given), f:<n> -> fact (JSON), off, groups
local text = ARGV[1]
local where = ARGV[2] -- where it was said, as /memory lists it
local key = ARGV[3]
local replace = tonumber(ARGV[4]) -- the number of the fact to rewrite; 0 for a new one
local cap = tonumber(ARGV[5])
local evict = ARGV[6] -- '1': when full, the least recently written fact makes room
local keep_ms = tonumber(ARGV[7])
local now = now_ms()
local fields = redis.call('HGETALL', memory)
local count, oldest, oldest_at = 0, nil, nil
for i = 1, #fields, 2 do
  local name = fields[i]
  if string.sub(name, 1, 2) == 'f:' then
    local fact = cjson.decode(fields[i + 1])
    if fact.key == key then
      return cjson.encode({status = 'exists', n = tonumber(string.sub(name, 3)), evicted = 0})
    end
    count = count + 1
    if oldest_at == nil or fact.at < oldest_at then
      oldest, oldest_at = name, fact.at
    end
  end
end
local fact = cjson.encode({text = text, where = where, at = now, key = key})
if replace > 0 then
  if redis.call('HEXISTS', memory, 'f:' .. replace) == 0 then
    return cjson.encode({status = 'missing', n = replace, evicted = 0})
  end
  redis.call('HSET', memory, 'f:' .. replace, fact)
  redis.call('PEXPIRE', memory, keep_ms)
  return cjson.encode({status = 'replaced', n = replace, evicted = 0})
end
local evicted = 0
if count >= cap then
  if evict ~= '1' or oldest == nil then
    return cjson.encode({status = 'full', n = 0, evicted = 0})
  end
  redis.call('HDEL', memory, oldest)
  evicted = tonumber(string.sub(oldest, 3))
end
local n = redis.call('HINCRBY', memory, 'next', 1)
redis.call('HSET', memory, 'f:' .. n, fact)
redis.call('PEXPIRE', memory, keep_ms)
return cjson.encode({status = 'saved', n = n, evicted = evicted})
