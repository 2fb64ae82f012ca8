-- _line.lua: where a pending request stands in the line of service, and when it should
-- be ready (its position and its ETA). Prepended to create_request.lua (the ETA a
-- request is created with, which its ready time is later compared with) and to
-- request_place.lua (GET /ondemandvm/<id>), after the rendered keys (QUOTA_PARKED,
-- QUOTA_PARKED_LINE, LINE_STATS, CLONE_SLOTS: vmpool/state/quotas.py).
--
-- The line is the provision queue (Keys.provision_queue: the pending requests with VMs
-- still to reserve), scored by each request's place (line_new_place), fixed when it is
-- created: the provision work set serves requests in that order, and a clone slot goes
-- to the request first in it (_slots.lua, slot_acquire_in_line, in reserve_vm.lua). A request's
-- position is 0 once it is being provisioned (a VM of it reserved or claimed), else 1 +
-- the requests ahead of it in the queue. Only a request placed ahead of it raises it:
-- one of a higher (or aged) priority that arrives, another user's that fair share puts
-- in between its user's waiting requests, or one ahead that lost a VM and waits for its
-- replacement.
--
-- The ETA (seconds from now) is an estimate from what the line observed (LINE_STATS,
-- kept by _quota.lua in the transitions): the requests ahead that compete for clone
-- slots (not those parked on their user's quota), beyond the slots free now, each one
-- service interval of the line (the running average of the time between two requests
-- starting while others waited), less the time since the last start; then the slowest
-- of the request's pools' reservation-to-ready time, or nothing when the pools' ready
-- VMs (the warm stock) cover it. A request parked on its user's quota has no ETA: it
-- waits for the user to give VMs back.

local function line_number(field)
  return tonumber(redis.call('HGET', LINE_STATS, field) or '') or 0
end

-- The place in line of a new request ``rid`` of ``user`` at ``priority`` (create_request):
-- its arrival ``now`` less its priority's ``lead``, and at least one ``round`` (the aging
-- period) behind its user's previous request of that priority while that one still
-- waits in line (``queue_key``). So a request's effective priority rises one level per
-- round it waits, and a user's second waiting request stands one level below their
-- first: another user's request arriving meanwhile comes in between (fair share), and
-- one user's burst cannot starve another user's request.
local function line_new_place(rid, user, priority, now, lead, round, queue_key)
  local place = now - lead
  local field = 'last:' .. priority .. ':' .. user
  local last = redis.call('HGET', LINE_STATS, field)
  if last then
    local at, previous = string.match(last, '^(%S+) (.+)$')
    if previous and redis.call('ZSCORE', queue_key, previous) then
      place = math.max(place, tonumber(at) + round)
    end
  end
  redis.call('HSET', LINE_STATS, field, string.format('%.6f %s', place, rid))
  return place
end

-- The slowest of the request's pools' observed reservation-to-ready time, and whether
-- their ready VMs cover what it asks.
local function line_service(req, pool_prefix)
  local slowest, covered = 0, true
  for _, pool, n in string.gmatch(req.requested, '([^:,]+):([^:,]+):(%d+)') do
    slowest = math.max(slowest, line_number('ready:' .. pool))
    if redis.call('ZCARD', pool_prefix .. pool .. ':ready') < tonumber(n) then
      covered = false
    end
  end
  return slowest, covered
end

-- How long until a request with ``others`` requests competing ahead of it starts.
local function line_wait(others, now, clone_limit)
  local free = others + 1
  if clone_limit > 0 then
    free = clone_limit - redis.call('ZCOUNT', CLONE_SLOTS, string.format('(%.6f', now), '+inf')
  end
  local turns = math.max(0, others + 1 - math.max(0, free))
  if turns == 0 then
    return 0
  end
  local since = math.max(0, now - line_number('last_start'))
  return math.max(0, turns * line_number('interval') - since)
end

-- Request ``rid`` (its hash ``req``): its position and ETA (nil while parked on its
-- user's quota), at server time ``now``. ``clone_limit``: the fleet's (0: unknown, no
-- wait for a slot is counted).
local function line_place(req, rid, now, queue_key, pool_prefix, clone_limit)
  local slowest, covered = line_service(req, pool_prefix)
  local score = redis.call('ZSCORE', queue_key, rid)
  if not score or tonumber(req.unreserved) < tonumber(req.need) then
    local since = tonumber(req.started or req.created)
    local eta = math.max(0, slowest - (now - since))
    if score then
      eta = eta + line_number('interval')  -- the rest of it waits for a turn
    end
    return 0, eta
  end
  local ahead = redis.call('ZCOUNT', queue_key, '-inf', '(' .. score)
  if redis.call('HEXISTS', QUOTA_PARKED, rid) == 1 then
    return ahead + 1, nil
  end
  local others = ahead - redis.call('ZCOUNT', QUOTA_PARKED_LINE, '-inf', '(' .. score)
  local service = slowest
  if covered then
    service = 0
  end
  return ahead + 1, line_wait(others, now, clone_limit) + service
end
