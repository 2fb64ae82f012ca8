-- work_claim.lua: claim up to N subjects of a work set for one batch job, in the order
-- of service (_workset.lua, prepended with WORK_PARTS; vmpool/state/workset.py loads it).
-- KEYS[1]  the work set (keys.work_set(job)); its parts are reached by suffix
-- ARGV[1]  how many to claim at most
-- ARGV[2]  the claim's lease in seconds
-- ARGV[3]  the claim's id (fresh per claim)
-- Returns: the subjects now claimed, in the order of service.
-- Invariant: a subject is claimed by one batch job at a time while its lease runs; a
-- claimer that dies leaves its subjects claimed until the lease ends, then they are
-- back in line at their arrival (a killed worker loses nothing, and its subjects lose
-- no place). Owners are served round-robin, each owner's subjects oldest first
-- (_workset.lua). Time is the Redis server's.
local W = ws_parts(KEYS[1])
local now = ws_now()
ws_requeue_lapsed(W, now, 1000)
local want = tonumber(ARGV[1])
local out = {}
while #out < want do
  -- the first owner in line, and whether another waits behind it (then one subject
  -- each in turn; alone, it takes what the claim still wants at once)
  local top = redis.call('ZRANGE', W.turns, 0, 1)
  if #top == 0 then
    break
  end
  local owner = top[1]
  local queue = W.queue .. owner
  local take = #top == 1 and want - #out or 1
  local heads = redis.call('ZRANGE', queue, 0, take - 1)
  if #heads == 0 then
    redis.call('ZREM', W.turns, owner)  -- nothing waiting: out of line
  else
    redis.call('ZREM', queue, unpack(heads))
    for _, subject in ipairs(heads) do
      out[#out + 1] = subject
    end
    -- served now: to the back of the line (a microsecond apart within one claim, so
    -- the owners of one claim keep their order for the next)
    local served = ws_fmt(now + #out / 1000000)
    redis.call('HSET', W.served, owner, served)
    if redis.call('ZCARD', queue) == 0 then
      redis.call('ZREM', W.turns, owner)
    else
      redis.call('ZADD', W.turns, served, owner)
    end
  end
end
if #out > 0 then
  local lease_end = ws_fmt(now + tonumber(ARGV[2]))
  local leases, holders = {}, {}
  for _, subject in ipairs(out) do
    leases[#leases + 1] = lease_end
    leases[#leases + 1] = subject
    holders[#holders + 1] = subject
    holders[#holders + 1] = ARGV[3]
  end
  redis.call('ZADD', W.claims, unpack(leases))
  redis.call('HSET', W.claimed, unpack(holders))
end
return out
