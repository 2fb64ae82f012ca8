-- clone_semaphore.lua: the fleet-wide on-demand clone limit (ondemand_clone_limit), a
-- counting semaphore of leases shared by every worker process on every machine.
-- Not a store script: vmpool/semaphore.py loads it alone (no transition tables).
-- KEYS[1]  the lease zset (keys.clone_slots): member = lease id (the VM name),
--          score = the lease's expiry, in Redis server time (seconds)
-- ARGV[1]  operation: 'acquire' | 'acquire_all' | 'release' | 'count'
-- ARGV[2]  lease id (acquire, release); the limit (acquire_all)
-- ARGV[3]  the limit (acquire); lease duration in seconds (acquire_all)
-- ARGV[4]  lease duration in seconds (acquire); the first lease id (acquire_all)
-- ARGV[5..] further lease ids (acquire_all)
-- Returns: acquire -> 1 granted (or renewed: the id already held a live lease), 0 full;
--          acquire_all -> per lease id, in order, what acquire would return for it,
--          each taken in turn (a batch job's create claim: one call for its VMs);
--          release -> 1 if a lease was dropped, 0 if there was none;
--          count   -> the number of live leases.
-- Invariant: at most ARGV[3] live leases exist at once, whoever asks and however many
-- processes ask together (the check and the ZADD are one atomic unit). Expired leases
-- are dropped before anything is counted, so the slot of a worker killed mid-create
-- comes back by itself once its lease runs out; no process has to clean up for it.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.6f', now))
local op = ARGV[1]
if op == 'count' then
  return redis.call('ZCARD', KEYS[1])
end
if op == 'release' then
  return redis.call('ZREM', KEYS[1], ARGV[2])
end
local function acquire(holder, limit, expiry)
  if redis.call('ZSCORE', KEYS[1], holder) then
    redis.call('ZADD', KEYS[1], expiry, holder)
    return 1
  end
  if redis.call('ZCARD', KEYS[1]) >= limit then
    return 0
  end
  redis.call('ZADD', KEYS[1], expiry, holder)
  return 1
end
if op == 'acquire' then
  return acquire(ARGV[2], tonumber(ARGV[3]), string.format('%.6f', now + tonumber(ARGV[4])))
end
if op == 'acquire_all' then
  local expiry = string.format('%.6f', now + tonumber(ARGV[3]))
  local out = {}
  for i = 4, #ARGV do
    out[#out + 1] = acquire(ARGV[i], tonumber(ARGV[2]), expiry)
  end
  return out
end
return redis.error_reply('clone_semaphore: unknown operation ' .. tostring(op))
