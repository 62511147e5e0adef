-- May the bot make these platform calls now, each under every scope it falls under (the bot as
-- a whole, a chat, a group)? The outbound budget every replica shares: a scope allows `count`
-- calls in any sliding `per_ms`, counted from the server's clock. One call asks for all of a
-- replica's waiting replies at once (bot/outbound/pacing.py), in their order, each seeing the slots the
-- ones before it took; a preview asks alone.
-- A call granted is recorded under each scope as in flight, counted from `lapse_ms` ahead: it
-- fills a slot until a later call stamps the moment it was answered (the platform saw it
-- before that, so nothing sent later can land in its window too early). Its replica keeps it
-- in flight meanwhile (budget_keep.lua), for up to `in_flight_ms`, the longest a call may
-- take; a dead replica's calls stop being kept, and count as made when they lapse, since the
-- platform saw them before then if at all.
-- A reply waits its turn: it joins the queue of each scope that stops it, ordered by
-- `order_ms` (when its window closed), and replies earlier in a queue are served first,
-- whichever replica holds them. A preview (a draft, a typing indicator) never waits and never
-- delays a reply: it is granted only while no reply waits and `keep_free_pct` of the scope
-- stays free, else shed.
-- A scope shared fairly (a group's: `fair` '1') is shared between the people its replies are
-- for: each person may take one of its slots every `per_ms * active / count` ms, `active` being
-- the people heard from in it within a period (`people`: person -> their due, when they may
-- take their next slot, or when they last asked if later). Together they never fill it faster
-- than its rate, so however one of them floods, its slots free at a steady pace; and a reply
-- whose person has had their share is placed at their due, behind every reply whose window
-- closed before it, so a freed slot goes to someone who has not; once it passes, their replies
-- are placed by their windows again, the oldest first. A person may run `fair_burst` slots
-- ahead of their pace before they are kept back. A promised part (order_ms
-- 0: the rest of a reply already under way, a notice) is not kept back by its person's due,
-- and counts towards it.
-- A scope held after a 429 (budget_hold.lua) grants nothing until the hold ends; a preview is
-- also stopped by the hold of the previews' own scope (a 429 on a preview holds only that).
-- A waiting reply keeps its place while its ticket lives: its replica asks again, or refreshes
-- the tickets of all its waiting replies at once (budget_keep.lua), well within
-- `lapse_ms`, and one that stops waiting leaves at once (budget_leave.lua), so a dead
-- replica's places are gone within `lapse_ms`.
-- A budget found without its epoch by a replica that has `seen` it lost its keys (a flush, a
-- failover that lost recent writes): it starts as if each scope's last period had been full,
-- its calls leaving the window evenly, rather than let a burst through that the platform would
-- refuse. A budget no replica has seen yet (a first start) starts free.
-- First, the same call records the answers of calls granted before (stamps): a call answered
-- (used '1') counts from now, the server's clock, in each scope's window, since the platform
-- saw it before this; a call never made (used '0': a reply found stale after waiting its turn,
-- an answer lost) gives its slot back, and `freed` counts it, so every replica's waiting
-- replies learn that a slot came free early (budget_keep.lua). An id no longer recorded (its
-- window passed) is left alone.
-- ARGV past the named ones: the stamps' count, each stamp's (grant, used, scope count); then
-- each ask's (kind, ticket, order_ms, grant, person, keep_free_pct, scope count), then each of
-- its scopes' (name, count, per_ms, fair). KEYS past the named ones: each stamp's scopes'
-- sent, then each ask's scopes' (sent, queue, hold, people), in the same order.
-- Returns {freed, answers}: freed, the count of places given back early so far
-- (budget_keep.lua returns it too); an answer an ask, in order: {status, wait_ms, scope,
-- held}, status 'granted', 'wait' (a reply: ask again in wait_ms) or 'shed' (a preview);
-- scope, the one that stopped the call; held, whether a hold did.
local tickets = KEYS[1]
local holds = KEYS[2]
local epoch = KEYS[3] -- when the budget's keys were first written
local previews_hold = KEYS[4] -- the hold of the previews' own scope
local freed = KEYS[5] -- places and slots given back early so far (budget_leave.lua)
local in_flight_ms = tonumber(ARGV[1]) -- the longest a replica keeps a call in flight
-- A waiter, or a call in flight, not kept alive for this long is gone (its replica died).
local lapse_ms = tonumber(ARGV[2])
local poll_ms = tonumber(ARGV[3]) -- a fair bound on how long a platform takes to answer
-- In a scope shared fairly, how many slots a person may take ahead of their pace: a quick
-- exchange in a quiet group is not spread out, while a flood still fills the scope no faster
-- than its rate once the few are spent.
local fair_burst = tonumber(ARGV[4])
local epoch_keep_ms = tonumber(ARGV[5]) -- how long the epoch outlives the budget's last call
local seen = ARGV[6] -- '1': the caller has found this budget's epoch before
local NAMED = 6
local KEYED = 5

local now = now_ms()
local arg, key = NAMED + 2, KEYED + 1
for _ = 1, tonumber(ARGV[NAMED + 1]) do
  local grant, used, count = ARGV[arg], ARGV[arg + 1], tonumber(ARGV[arg + 2])
  for i = key, key + count - 1 do
    if used == '1' then
      redis.call('ZADD', KEYS[i], 'XX', now, grant)
    else
      redis.call('ZREM', KEYS[i], grant)
    end
  end
  if used ~= '1' then
    redis.call('INCR', freed)
    redis.call('PEXPIRE', freed, epoch_keep_ms)
  end
  arg, key = arg + 3, key + count
end

local began = tonumber(redis.call('GET', epoch) or '0')
if began == 0 or began > now then
  began = seen == '1' and now or now - epoch_keep_ms
  redis.call('SET', epoch, began, 'PX', epoch_keep_ms)
else
  redis.call('PEXPIRE', epoch, epoch_keep_ms)
end
redis.call('ZREMRANGEBYSCORE', holds, '-inf', now)
drop_lapsed(tickets, freed, now, 16, epoch_keep_ms)

local function alive(waiter)
  return tonumber(redis.call('ZSCORE', tickets, waiter) or '0') > now
end

-- How many live waiters come before `ask` (placed at `place`) in `queue`, counting up to
-- `limit`; the gone ones met on the way are dropped.
local function ahead(ask, queue, place, limit)
  local found = 0
  local first = redis.call('ZRANGEBYSCORE', queue, '-inf', '(' .. place, 'LIMIT', 0, limit + 16)
  for _, waiter in ipairs(first) do
    if waiter ~= ask.ticket then
      if alive(waiter) then
        found = found + 1
        if found >= limit then
          break
        end
      else
        redis.call('ZREM', queue, waiter)
      end
    end
  end
  return found
end

local function anyone_waiting(queue)
  for _, waiter in ipairs(redis.call('ZRANGE', queue, 0, 15)) do
    if alive(waiter) then
      return true
    end
    redis.call('ZREM', queue, waiter)
  end
  return false
end

-- When the `needed`-th slot of a full scope comes (1: the next one; the replies ahead take the
-- ones before it). Its `count` slots come round in turn: a recorded call's when it leaves the
-- window (a period after its answer: a call still in flight cannot be answered before now), a
-- slot free now (a reply ahead takes it at once) a period from now; and each round ahead a
-- period later. Each call is answered a little after it is made, so each round and each call
-- in flight adds `poll_ms` (a fair bound on a platform's answer): a reply told when to ask
-- again is then granted when it does, not told to wait a little more.
local function frees_in(sent, count, per_ms, needed)
  local rounds = math.floor((needed - 1) / count)
  local index = (needed - 1) % count
  local at = now + per_ms + poll_ms
  local nth = redis.call('ZRANGE', sent, index, index, 'WITHSCORES')
  if nth[2] ~= nil and tonumber(nth[2]) <= now then
    at = tonumber(nth[2]) + per_ms
  end
  return math.max(at - now + rounds * (per_ms + poll_ms), 1)
end

-- A budget that lost its keys: of the calls its last period is taken to have made, evenly
-- spread, those still in the window now (0 once a period has passed since the epoch), and when
-- the next of them leaves it.
local function assumed(count, per_ms)
  local since = now - began
  if since >= per_ms then
    return 0, 0
  end
  local left = math.floor(since * count / per_ms)
  return count - left, math.max(math.ceil(began + (left + 1) * per_ms / count - now), 1)
end

-- `person`'s share of a scope shared fairly: when they may take its next slot (their due; 0
-- for someone not heard from within a period), and how far one slot taken pushes it. Asking
-- counts as being heard from: a person waiting is one of those the scope is shared between.
local function share_of(scope, person)
  redis.call('ZREMRANGEBYSCORE', scope.people, '-inf', now - scope.per_ms)
  local due = tonumber(redis.call('ZSCORE', scope.people, person) or '0')
  local active = redis.call('ZCARD', scope.people)
  if due == 0 then
    active = active + 1
  end
  if due < now then
    redis.call('ZADD', scope.people, now, person)
    if redis.call('PTTL', scope.people) < scope.per_ms then
      redis.call('PEXPIRE', scope.people, scope.per_ms)
    end
  end
  return due, math.ceil(scope.per_ms * active / scope.count)
end

local GRANTED = {status = 'granted', wait_ms = 0, scope = '', held = false}

-- One ask: granted (recorded in each scope), or told to wait (queued where it is stopped) or
-- shed.
local function take(ask)
  -- An ask made again after its answer was lost (a timeout, a connection cut by a restart)
  -- that had been granted: granted again, rather than take a second slot and leave the first
  -- in flight until it lapses.
  if #ask.scopes > 0 and redis.call('ZSCORE', ask.scopes[1].sent, ask.grant) then
    redis.call('ZREM', tickets, ask.ticket)
    return GRANTED
  end
  local wait, stopped_by, held = 0, '', false
  for _, scope in ipairs(ask.scopes) do
    scope.fair = scope.fair and ask.kind == 'reply' and ask.person ~= ''
    if scope.fair then
      scope.due, scope.spacing = share_of(scope, ask.person)
      -- When this person may take a slot: their due, less the slots they may run ahead.
      scope.from = scope.due - (fair_burst - 1) * scope.spacing
      -- A person who has had their share is placed where it comes back (behind everyone
      -- whose window closed before it); a promised part is not kept back.
      scope.kept = ask.order_ms > 0 and scope.from > now
      if scope.kept then
        scope.place = math.max(ask.order_ms, scope.from)
      end
    end
    local hold_until = tonumber(redis.call('GET', scope.hold) or '0')
    if ask.kind ~= 'reply' then
      hold_until = math.max(hold_until, tonumber(redis.call('GET', previews_hold) or '0'))
    end
    if hold_until > now then
      scope.wait = hold_until - now
    else
      redis.call('ZREMRANGEBYSCORE', scope.sent, '-inf', now - scope.per_ms)
      local before, next_leaves = assumed(scope.count, scope.per_ms)
      local free = scope.count - redis.call('ZCARD', scope.sent) - before
      local needed = 1
      if ask.kind == 'reply' then
        -- Replies ahead (some may be gone): each takes a slot first.
        local queued = redis.call('ZCOUNT', scope.queue, '-inf', '(' .. scope.place)
        needed = math.max(queued - free, 0) + 1
        if free > 0 and queued > 0 then
          free = free - ahead(ask, scope.queue, scope.place, free)
        end
      elseif anyone_waiting(scope.queue) then
        free = 0
      else
        free = free - math.ceil(scope.count * ask.keep_free_pct / 100)
      end
      if free <= 0 and before > 0 then
        scope.wait = next_leaves
      elseif free <= 0 then
        scope.wait = frees_in(scope.sent, scope.count, scope.per_ms, needed)
      end
      if scope.kept then
        -- This person has had their share for now.
        scope.wait = math.max(scope.wait, scope.from - now)
      end
    end
    if scope.wait > wait then
      wait, stopped_by, held = scope.wait, scope.name, hold_until > now
    end
  end

  if wait == 0 then
    for _, scope in ipairs(ask.scopes) do
      redis.call('ZADD', scope.sent, now + lapse_ms, ask.grant)
      redis.call('PEXPIRE', scope.sent, scope.per_ms + in_flight_ms + lapse_ms)
      redis.call('ZREM', scope.queue, ask.ticket)
      if scope.fair then
        local due = math.max(scope.due, now) + scope.spacing
        redis.call('ZADD', scope.people, due, ask.person)
        if redis.call('PTTL', scope.people) < due - now + scope.per_ms then
          redis.call('PEXPIRE', scope.people, due - now + scope.per_ms)
        end
      end
    end
    redis.call('ZREM', tickets, ask.ticket)
    return GRANTED
  end
  if ask.kind ~= 'reply' then
    return {status = 'shed', wait_ms = wait, scope = stopped_by, held = held}
  end
  -- In the queue of each scope that stops it, and out of the others: a reply kept back by its
  -- chat reserves nothing bot-wide meanwhile.
  -- A queue outlives by far the wait of the last reply placed in it, which asks again by then:
  -- its waiters' tickets are kept alive meanwhile by their replicas, and the gone ones in it
  -- are dropped as they are met.
  for _, scope in ipairs(ask.scopes) do
    if scope.wait > 0 then
      redis.call('ZADD', scope.queue, scope.place, ask.ticket)
      if redis.call('PTTL', scope.queue) < wait + in_flight_ms then
        redis.call('PEXPIRE', scope.queue, wait + in_flight_ms)
      end
    else
      redis.call('ZREM', scope.queue, ask.ticket)
    end
  end
  redis.call('ZADD', tickets, now + lapse_ms, ask.ticket)
  if redis.call('PTTL', tickets) < lapse_ms then
    redis.call('PEXPIRE', tickets, lapse_ms)
  end
  return {status = 'wait', wait_ms = wait, scope = stopped_by, held = held}
end

local answers = {}
while arg <= #ARGV do
  local ask = {
    kind = ARGV[arg], ticket = ARGV[arg + 1], order_ms = tonumber(ARGV[arg + 2]),
    grant = ARGV[arg + 3], person = ARGV[arg + 4], keep_free_pct = tonumber(ARGV[arg + 5]),
    scopes = {},
  }
  local count = tonumber(ARGV[arg + 6])
  arg = arg + 7
  for i = 1, count do
    ask.scopes[i] = {
      sent = KEYS[key], queue = KEYS[key + 1], hold = KEYS[key + 2], people = KEYS[key + 3],
      name = ARGV[arg], count = tonumber(ARGV[arg + 1]), per_ms = tonumber(ARGV[arg + 2]),
      fair = ARGV[arg + 3] == '1', wait = 0, place = ask.order_ms,
    }
    arg, key = arg + 4, key + 4
  end
  answers[#answers + 1] = take(ask)
end
return cjson.encode({freed = tonumber(redis.call('GET', freed) or '0'), answers = answers})
