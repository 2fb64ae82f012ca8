-- _slots.lua: the clone semaphore's leases (ondemand_clone_limit), as functions shared
-- by clone_semaphore.lua (vmpool/state/semaphore.py) and the store scripts that take a
-- VM's slot in its reservation (reserve_vm, pool_reserve) and give it back when the VM
-- was created (vm_created, pool_vm_created). Whoever prepends it binds the keys first:
--   CLONE_SLOTS   zset: VM name -> its lease's end (Redis server time, seconds)
--   SLOT_HOLDERS  hash: VM name -> its holder's token, an integer: the fencing token
--                 of the VM lock it was taken under, 0 when taken at the reservation
--   SLOT_STATS    hash: peak (most live leases seen at once), overruns (renewals
--                 that found their lease gone and no slot free)
--   SLOT_LINE     zset: requests that found no slot free -> their place in line
--                 (_line.lua); a request leaves it once it has its VMs, left pending,
--                 or was parked (_quota.lua slot_line_leave)
-- Every function takes the caller's server time ``now`` (one TIME per script) and
-- drops the expired leases first, once per script (slots_drop_expired).
-- Invariant: a grant never makes more than the limit live leases (the check and the
-- ZADD are one unit); a lease is released or renewed only by its holder (or, release,
-- a newer holder of the VM's lock), so a creator paused past its lease cannot drop the
-- slot of the one that took its VM over. Expired leases are dropped before anything
-- is counted, so a dead worker's slot comes back by itself. The peak records the most
-- live leases ever seen at once. Slots go to requests in the order of their places: a
-- request waiting for one is not passed by a request placed after it.

local slots_dropped = false

-- The leases past their end are dropped (a dead worker's slot comes back): once per
-- script, before the first count.
local function slots_drop_expired(now)
  if slots_dropped then
    return
  end
  slots_dropped = true
  local expired = redis.call('ZRANGEBYSCORE', CLONE_SLOTS, '-inf', string.format('%.6f', now))
  if #expired > 0 then
    redis.call('ZREM', CLONE_SLOTS, unpack(expired))
    redis.call('HDEL', SLOT_HOLDERS, unpack(expired))
  end
end

local function slot_holder(name)
  return tonumber(redis.call('HGET', SLOT_HOLDERS, name) or '0')
end

-- The lease of ``name`` set to end at ``expiry`` for ``token``. ``live``: the live
-- leases after it, when the caller knows them and the lease is new (the peak's check),
-- nil for a renewal (a renewal adds no lease, so the peak cannot grow).
local function slot_take(name, token, expiry, live)
  redis.call('ZADD', CLONE_SLOTS, expiry, name)
  redis.call('HSET', SLOT_HOLDERS, name, token)
  if live and live > tonumber(redis.call('HGET', SLOT_STATS, 'peak') or '0') then
    redis.call('HSET', SLOT_STATS, 'peak', live)
  end
end

-- 1 granted (a new lease, or the VM's lease renewed or taken over: its token was not
-- newer than ours), 0 refused (no slot free, or a newer holder of the VM has it).
-- ``live``: the live lease count when the caller just read it, having found the VM
-- holding no lease (else both are read here).
local function slot_acquire(name, token, limit, expiry, now, live)
  slots_drop_expired(now)
  if not live and redis.call('ZSCORE', CLONE_SLOTS, name) then
    if tonumber(token) < slot_holder(name) then
      return 0
    end
    slot_take(name, token, expiry, nil)
    return 1
  end
  live = live or redis.call('ZCARD', CLONE_SLOTS)
  if live >= limit then
    return 0
  end
  slot_take(name, token, expiry, live + 1)
  return 1
end

-- slot_acquire for request ``rid`` at ``place`` in line: a new lease only in its turn
-- (fewer requests ahead of it in SLOT_LINE than slots free); refused, the request
-- joins SLOT_LINE at its place (the one write of a refusal: a repeat writes the same).
-- ``name``: a VM not recorded yet (reserve_vm checked), so it holds no lease: a lease
-- is taken only with its VM's record or under its lock, and ends long before the
-- record's tombstone; were one left, it is counted among the live leases all the same.
local function slot_acquire_in_line(name, token, limit, expiry, now, rid, place)
  slots_drop_expired(now)
  local ahead = redis.call('ZCOUNT', SLOT_LINE, '-inf', '(' .. place)
  local live = redis.call('ZCARD', CLONE_SLOTS)
  if live + ahead >= limit then
    redis.call('ZADD', SLOT_LINE, place, rid)
    return 0
  end
  return slot_acquire(name, token, limit, expiry, now, live)
end

-- How many of the line's first requests slot_turns reads before it counts the slots:
-- an empty line (a fleet within its clone limit) costs one read, a line no longer than
-- this none more than the count needs.
local SLOT_TURNS_PEEK = 16

-- The first requests of SLOT_LINE, as many as slots are free: whose turn it is. The line
-- is read first, so an empty one answers at once (nothing is counted, so nothing needs
-- dropping); else as many as the peek holds are taken from it.
local function slot_turns(limit, now)
  if limit <= 0 then
    return {}
  end
  local first = redis.call('ZRANGE', SLOT_LINE, 0, math.min(limit, SLOT_TURNS_PEEK) - 1)
  if #first == 0 then
    return {}
  end
  slots_drop_expired(now)
  local free = limit - redis.call('ZCARD', CLONE_SLOTS)
  if free <= 0 then
    return {}
  end
  if free <= #first then
    return {unpack(first, 1, free)}
  end
  if #first < SLOT_TURNS_PEEK then
    return first  -- the whole line
  end
  return redis.call('ZRANGE', SLOT_LINE, 0, free - 1)
end

-- Whether a request new at ``place`` would only join SLOT_LINE at its first reservation
-- (slot_acquire_in_line): others wait in line ahead of it and no slot is free in its
-- turn. An empty line answers false at once (one read): a fleet within its clone
-- limit, or one whose slots come back faster than requests arrive, keeps every new
-- request in reach of any worker's provision claim.
local function slot_line_full_for(place, limit, now)
  local ahead = redis.call('ZCOUNT', SLOT_LINE, '-inf', '(' .. place)
  if ahead == 0 then
    return false
  end
  slots_drop_expired(now)
  return redis.call('ZCARD', CLONE_SLOTS) + ahead >= limit
end

-- 1 if the lease of ``name`` was dropped (it was ``token``'s or an older holder's),
-- 0 otherwise. A lease's holder is written and dropped with it (slot_take, here,
-- slots_drop_expired), so a VM with a holder has its lease: the lease is looked up
-- only for a VM with none (a lease taken before holders were kept counts as token 0's).
local function slot_release(name, token)
  local holder = redis.call('HGET', SLOT_HOLDERS, name)
  if holder then
    if tonumber(holder) > tonumber(token) then
      return 0
    end
    redis.call('HDEL', SLOT_HOLDERS, name)
  elseif not redis.call('ZSCORE', CLONE_SLOTS, name) then
    return 0
  end
  redis.call('ZREM', CLONE_SLOTS, name)
  return 1
end

-- A created VM's slot given back by the move that ends its clone (vm_created.lua,
-- pool_vm_created.lua): ``reply`` (the move's) with, when ``limit`` is not '' and the
-- lease was ``token``'s (or an older holder's), the requests whose turn it is now
-- appended, for the caller to dispatch at once.
local function slot_give_back(reply, name, token, limit, now)
  if not limit or limit == '' then
    return reply
  end
  if slot_release(name, tonumber(token) or 0) == 1 then
    for _, rid in ipairs(slot_turns(tonumber(limit), now)) do
      reply[#reply + 1] = rid
    end
  end
  return reply
end
