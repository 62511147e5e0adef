-- Record the tool calls one model step asked for, in the turn's record, before any of them
-- runs: a later generation of the same turn (after an interrupt, a /retry, a takeover by
-- another replica) resumes from the record instead of asking the model, and running, anew.
-- The record holds the newest MAX_TURNS turns (a turn's id: the first version of the burst
-- it was made for), and always the turn of the last reply sent ('kept', commit.lua), so a
-- /retry of the last reply finds its turn's calls however many newer bursts recorded their own.
-- A turn's record is born with a random id of the caller's making: the calls' idempotency keys
-- carry it, so no key is ever given to two different calls, even after V starts again from 0.
-- Each step keeps the version its prompt covered ('v:<turn>:<step>'): a call of a step asked
-- for before the user's newest word never starts (tool_begin.lua). Checked against the lease's
-- token and fence, so a holder that lost its lease records nothing.
-- Returns the turn's record id, or '' if the lease is no longer ours
local lease = KEYS[1]
local tools = KEYS[2]
local token = ARGV[1]
local fence = ARGV[2]
local turn = ARGV[3] -- the id of the turn the calls are for
local step = tonumber(ARGV[4]) -- counted from 0 within the turn
local calls = ARGV[5] -- json: [{id, name, arguments, tool}]
local version = ARGV[6] -- the version the step's prompt covered
local id = ARGV[7] -- the turn's record id, if it is born now
local retention_ms = tonumber(ARGV[8])
-- Turns kept: the one a /retry may write again, the one being answered, and a few spare.
local MAX_TURNS = 4

if not holds(lease, token, fence) then
  return ''
end
if not redis.call('HGET', tools, 'id:' .. turn) then
  redis.call('HSET', tools, 'id:' .. turn, id, 'steps:' .. turn, 0)
  local kept = tonumber(redis.call('HGET', tools, 'kept') or '')
  local turns = record_turns(tools)
  local over = #turns - MAX_TURNS
  for _, old in ipairs(turns) do
    if over > 0 and old ~= kept then
      drop_turn(tools, old)
      over = over - 1
    end
  end
end
-- Steps are recorded in order: a later step replaces the tail a cut-short generation left.
drop_turn(tools, turn, step)
redis.call('HSET', tools, 's:' .. turn .. ':' .. step, calls, 'v:' .. turn .. ':' .. step, version,
  'steps:' .. turn, step + 1)
keep_alive(retention_ms, tools)
return redis.call('HGET', tools, 'id:' .. turn) or ''
