-- _workset.lua: the work-set functions, shared by work_add.lua, work_claim.lua,
-- work_done.lua, create_request.lua and workers/lanes_probe.lua (each gets this text,
-- after WORK_PARTS rendered from vmpool/state/keys.py, by vmpool.state.workset.lua_workset).
--
-- A work set (vmpool/state/workset.py) of base key B (keys.work_set(job)) is:
--   B            zset  every subject waiting or claimed -> its arrival (server time, s):
--                      the dedup (a subject is in it once) and its place in line
--   B:queue:O    zset  the waiting subjects of owner O ('' for no user) -> arrival
--   B:turns      zset  the owners with a subject waiting -> their turn
--   B:served     hash  owner -> when it was last served
--   B:owner      hash  subject -> its owner (only when not '')
--   B:claims     zset  claimed or deferred subjects -> when their lease ends
--   B:claimed    hash  claimed subject -> the id of the claim that holds it
--
-- Order of service (docs/invariants.md, invariant 10; docs/state-machine.md "Order of
-- service"): a claim takes the owner with the smallest turn, and that owner's oldest
-- waiting subject; the owner's turn becomes the time of service (the back of the
-- line). A subject that starts waiting gives its owner the turn max(its arrival, when
-- the owner was last served), unless the owner's turn is earlier already. So owners
-- are served round-robin, each owner's subjects oldest first, and owners that each
-- wait with one subject are served in order of arrival.
-- Arrival is server time (a request's `created`), never the subject's name.
--
-- Invariants: a subject is claimed by one claim at a time while its lease runs; a
-- claim's lease that ends (its claimer died or stalled) puts the subject back in line
-- at its arrival; a claim ends (done, release, defer, renew) only subjects it still
-- holds.

local function ws_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function ws_fmt(x)
  return string.format('%.6f', x)
end

local function ws_parts(base)
  return {
    base = base,
    claims = base .. WORK_PARTS.claims,
    claimed = base .. WORK_PARTS.claimed,
    turns = base .. WORK_PARTS.turns,
    served = base .. WORK_PARTS.served,
    owner = base .. WORK_PARTS.owner,
    queue = base .. WORK_PARTS.queue,
  }
end

-- Put a subject in its owner's queue at its arrival. The owner's turn: at most
-- max(arrival, when it was last served) (an owner not in line joins it; one in line
-- keeps an earlier turn, and moves up to an older subject's that is not earlier than
-- its last service).
local function ws_enqueue(W, subject, arrival, owner)
  redis.call('ZADD', W.queue .. owner, arrival, subject)
  local turn = tonumber(arrival)
  local served = tonumber(redis.call('HGET', W.served, owner) or '0')
  if served > turn then
    turn = served
  end
  redis.call('ZADD', W.turns, 'LT', ws_fmt(turn), owner)
end

-- Add a subject (arrival: a score string) unless it is already waiting or claimed.
-- Returns 1 if added. A subject in the set but neither waiting in its owner's queue nor
-- claimed was added by an older release (a set scored 0, with no queues): it is put in
-- line now, at its arrival, so a rolling upgrade loses no subject.
local function ws_add(W, subject, arrival, owner)
  if redis.call('ZSCORE', W.base, subject) then
    if not redis.call('ZSCORE', W.claims, subject)
        and not redis.call('ZSCORE', W.queue .. owner, subject) then
      if owner ~= '' then
        redis.call('HSET', W.owner, subject, owner)
      end
      redis.call('ZADD', W.base, arrival, subject)
      ws_enqueue(W, subject, arrival, owner)
      return 1
    end
    return 0
  end
  redis.call('ZADD', W.base, arrival, subject)
  if owner ~= '' then
    redis.call('HSET', W.owner, subject, owner)
  end
  ws_enqueue(W, subject, arrival, owner)
  return 1
end

-- A claimed or deferred subject goes back in line, at its arrival.
local function ws_requeue(W, subject)
  redis.call('ZREM', W.claims, subject)
  redis.call('HDEL', W.claimed, subject)
  local arrival = redis.call('ZSCORE', W.base, subject)
  if arrival then
    ws_enqueue(W, subject, arrival, redis.call('HGET', W.owner, subject) or '')
  end
end

-- Leases that ended by `now`: their subjects go back in line (at most `max` of them).
local function ws_requeue_lapsed(W, now, max)
  local lapsed = redis.call('ZRANGEBYSCORE', W.claims, '-inf', ws_fmt(now), 'LIMIT', 0, max)
  for _, subject in ipairs(lapsed) do
    ws_requeue(W, subject)
  end
end

-- Add the subjects ARGV[first..] (work_add.lua's ARGV): with `head` '' they are VMs
-- (arrival now, no owner), else request ids, whose hash is head .. id .. tail: arrival
-- is the request's `created`, owner its `token_user`. Returns how many were added.
local function ws_add_subjects(W, head, tail, first)
  local stamp = ws_fmt(ws_now())
  local n = 0
  for i = first, #ARGV do
    local arrival, owner = stamp, ''
    if head ~= '' then
      local rec = redis.call('HMGET', head .. ARGV[i] .. tail, 'created', 'token_user')
      arrival = rec[1] or stamp
      owner = rec[2] or ''
    end
    n = n + ws_add(W, ARGV[i], arrival, owner)
  end
  return n
end
