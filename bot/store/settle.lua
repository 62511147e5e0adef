-- A reply was sent and its commit failed for good (a bug, or a key the commit writes damaged
-- by hand): what must not be left undone is done without the commit, so the conversation moves
-- on. W moves to the version the outbox covers, the messages it covered leave the pending set,
-- the outbox is cleared (the reply is never sent again) and the lease released. The history,
-- the totals and the tool record are not touched: what the commit would have written there is
-- lost, and the cycle logs it.
-- Returns {status = 'committed' | 'lost', look_in_ms = ms until the next look or -1}
local lease = KEYS[1]
local state = KEYS[2]
local pending = KEYS[3]
local outbox = KEYS[4]
local window = KEYS[5]
local due = KEYS[6]
local conversation = ARGV[1]
local token = ARGV[2]
local fence = ARGV[3]
if not holds(lease, token, fence) then
  return cjson.encode({status = 'lost', look_in_ms = -1})
end

local covered = tonumber(redis.call('HGET', outbox, 'version'))
local w = tonumber(redis.call('HGET', state, 'w') or '0')
if covered ~= nil and covered > w then
  for i = w + 1, covered do
    redis.call('HDEL', pending, i)
  end
  answered_to(state, window, covered)
end
return reply_ended(state, window, due, outbox, lease, conversation)
