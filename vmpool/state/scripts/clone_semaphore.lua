-- clone_semaphore.lua: the fleet-wide on-demand clone limit (ondemand_clone_limit), a
-- counting semaphore of leases shared by every worker process on every machine.
-- Not a store script: vmpool/semaphore.py loads it alone (no transition tables).
-- KEYS[1]  the lease zset (keys.clone_slots): member = lease id (the VM name),
--          score = the lease's expiry, in Redis server time (seconds)
-- ARGV[1]  operation: 'acquire' | 'release' | 'count'
-- ARGV[2]  lease id (acquire, release)
-- ARGV[3]  the limit (acquire)
-- ARGV[4]  lease duration in seconds (acquire)
-- Returns: acquire -> 1 granted (or renewed: the id already held a live lease), 0 full;
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
if op == 'acquire' then
  local expiry = string.format('%.6f', now + tonumber(ARGV[4]))
  if redis.call('ZSCORE', KEYS[1], ARGV[2]) then
    redis.call('ZADD', KEYS[1], expiry, ARGV[2])
    return 1
  end
  if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
    return 0
  end
  redis.call('ZADD', KEYS[1], expiry, ARGV[2])
  return 1
end
return redis.error_reply('clone_semaphore: unknown operation ' .. tostring(op))
