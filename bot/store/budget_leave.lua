-- A reply stopped waiting its turn without taking it (cancelled by a newer message, failed, its
-- replica shutting down): its place goes at once, rather than keep the replies behind it waiting
-- until its ticket expires.
local tickets = KEYS[1]
local ticket = ARGV[1]

redis.call('ZREM', tickets, ticket)
for _, queue in ipairs(KEYS) do
  if queue ~= tickets then
    redis.call('ZREM', queue, ticket)
  end
end
return 1
