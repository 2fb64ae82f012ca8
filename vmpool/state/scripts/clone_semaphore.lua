-- clone_semaphore.lua: the fleet-wide on-demand clone limit (ondemand_clone_limit), a
-- counting semaphore of leases shared by every worker process on every machine.
-- Not a store script: vmpool/state/semaphore.py loads it alone (no transition tables).
-- KEYS[1]  the lease zset (keys.clone_slots): member = VM name, score = the lease's
--          end, in Redis server time (seconds)
-- KEYS[2]  hash (keys.clone_slot_holders): VM name -> its holder's token, an integer:
--          the fencing token of the VM lock it was taken under, 0 when taken at the
--          VM's reservation (before any lock of it)
-- KEYS[3]  hash (keys.clone_slot_stats): peak (most live leases seen at once),
--          overruns (renewals that found their lease gone and no slot free)
-- KEYS[4]  zset (keys.clone_slot_line): requests that found no slot free -> their place
--          in line (scripts/_line.lua); reserve_vm.lua takes a request out once it has
--          its VMs, close_request (the request left pending) and quota_park.lua too,
--          and a provision that finds the request past its TTL (leave_line in
--          vmpool/state/semaphore.py)
-- ARGV[1]  operation: 'acquire' | 'acquire_in_line' | 'acquire_all' | 'renew' |
--          'release' | 'release_to_line' | 'count' | 'turns'
-- acquire:     ARGV[2] VM name, ARGV[3] token, ARGV[4] limit, ARGV[5] lease seconds
-- acquire_in_line: as acquire, then ARGV[6] the request's id, ARGV[7] its place: a new
--          lease only in its turn (fewer requests ahead of it in KEYS[4] than slots
--          free); refused, the request joins KEYS[4] at its place
-- turns:       ARGV[2] limit
-- acquire_all: ARGV[2] limit, ARGV[3] lease seconds, ARGV[4..] VM name, token pairs
-- renew:       ARGV[2] VM name, ARGV[3] token, ARGV[4] limit, ARGV[5] lease seconds
-- release:     ARGV[2] VM name, ARGV[3] token
-- release_to_line: as release, then ARGV[4] limit
-- Returns: acquire -> 1 granted (a new lease, or the VM's lease renewed or taken over:
--            its token was not newer than ours), 0 refused (no slot free, or a newer
--            holder of the VM has it);
--          acquire_all -> per VM, in order, what acquire returns, each in turn;
--          renew -> 1 renewed (or retaken: it had lapsed and a slot was free), 2 a
--            newer holder has it (stop renewing), 3 it had lapsed and no slot was
--            free: re-registered over the limit and counted as an overrun (the
--            create is under way; the count stays true, so no new slot is granted
--            until it is back under the limit);
--          release -> 1 if the lease was dropped (it was ours or an older holder's),
--            0 otherwise; release_to_line -> {1, the requests whose turn it is, as
--            turns} when the lease was dropped, {0} otherwise (the caller hands the
--            slot to the first in line at once); count -> the number of live leases;
--            turns -> the first requests of KEYS[4], as many as slots are free.
-- Invariant: a grant never makes more than the limit live leases (the check and the
-- ZADD are one unit); a lease is released or renewed only by its holder (or, release,
-- a newer holder of the VM's lock), so a creator paused past its lease cannot drop
-- the slot of the one that took its VM over. Expired leases are dropped before
-- anything is counted, so a dead worker's slot comes back by itself. The peak records
-- the most live leases ever seen at once (the audit and /metrics report it). Slots go
-- to requests in the order of their places: a request waiting for one is not passed by
-- a request placed after it (a new one, say, whose provisioning ran first).
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%.6f', now))
if #expired > 0 then
  redis.call('ZREM', KEYS[1], unpack(expired))
  redis.call('HDEL', KEYS[2], unpack(expired))
end
local op = ARGV[1]
if op == 'count' then
  return redis.call('ZCARD', KEYS[1])
end

local function lease_end(seconds)
  return string.format('%.6f', now + tonumber(seconds))
end

local function note_peak()
  local live = redis.call('ZCARD', KEYS[1])
  if live > tonumber(redis.call('HGET', KEYS[3], 'peak') or '0') then
    redis.call('HSET', KEYS[3], 'peak', live)
  end
end

local function holder(name)
  return tonumber(redis.call('HGET', KEYS[2], name) or '0')
end

local function take(name, token, expiry)
  redis.call('ZADD', KEYS[1], expiry, name)
  redis.call('HSET', KEYS[2], name, token)
  note_peak()
end

local function acquire(name, token, limit, expiry)
  if redis.call('ZSCORE', KEYS[1], name) then
    if tonumber(token) < holder(name) then
      return 0
    end
    take(name, token, expiry)
    return 1
  end
  if redis.call('ZCARD', KEYS[1]) >= limit then
    return 0
  end
  take(name, token, expiry)
  return 1
end

if op == 'acquire' then
  return acquire(ARGV[2], ARGV[3], tonumber(ARGV[4]), lease_end(ARGV[5]))
end
if op == 'acquire_in_line' then
  local limit = tonumber(ARGV[4])
  if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then
    local ahead = redis.call('ZCOUNT', KEYS[4], '-inf', '(' .. ARGV[7])
    if redis.call('ZCARD', KEYS[1]) + ahead >= limit then
      redis.call('ZADD', KEYS[4], ARGV[7], ARGV[6])
      return 0
    end
  end
  return acquire(ARGV[2], ARGV[3], limit, lease_end(ARGV[5]))
end
local function turns(limit)
  local free = limit - redis.call('ZCARD', KEYS[1])
  if free <= 0 then
    return {}
  end
  return redis.call('ZRANGE', KEYS[4], 0, free - 1)
end

if op == 'turns' then
  return turns(tonumber(ARGV[2]))
end
if op == 'acquire_all' then
  local expiry = lease_end(ARGV[3])
  local out = {}
  for i = 4, #ARGV, 2 do
    out[#out + 1] = acquire(ARGV[i], ARGV[i + 1], tonumber(ARGV[2]), expiry)
  end
  return out
end
if op == 'renew' then
  local name, token = ARGV[2], ARGV[3]
  if redis.call('ZSCORE', KEYS[1], name) then
    if holder(name) ~= tonumber(token) then
      return 2
    end
    redis.call('ZADD', KEYS[1], lease_end(ARGV[5]), name)
    return 1
  end
  local full = redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4])
  take(name, token, lease_end(ARGV[5]))
  if full then
    redis.call('HINCRBY', KEYS[3], 'overruns', 1)
    return 3
  end
  return 1
end
local function release(name, token)
  if redis.call('ZSCORE', KEYS[1], name) and holder(name) <= tonumber(token) then
    redis.call('ZREM', KEYS[1], name)
    redis.call('HDEL', KEYS[2], name)
    return 1
  end
  return 0
end

if op == 'release' then
  return release(ARGV[2], ARGV[3])
end
if op == 'release_to_line' then
  if release(ARGV[2], ARGV[3]) == 0 then
    return {0}
  end
  local out = {1}
  for _, rid in ipairs(turns(tonumber(ARGV[4]))) do
    out[#out + 1] = rid
  end
  return out
end
return redis.error_reply('clone_semaphore: unknown operation ' .. tostring(op))
