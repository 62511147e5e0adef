-- Take facts back from a person's memory, in their slot (`bot.store.memory`): fact `n`, or
-- every fact (n = 0), or everything kept, switches and numbering too ('erase': /forget).
-- Returns how many facts were removed
local memory = KEYS[1]
local n = tonumber(ARGV[1])
local erase = ARGV[2] -- '1': the whole memory goes
if n > 0 then
  return redis.call('HDEL', memory, 'f:' .. n)
end
local names = redis.call('HKEYS', memory)
local facts = {}
for _, name in ipairs(names) do
  if string.sub(name, 1, 2) == 'f:' then
    facts[#facts + 1] = name
  end
end
if erase == '1' then
  redis.call('DEL', memory)
elseif #facts > 0 then
  redis.call('HDEL', memory, unpack(facts))
end
return #facts
