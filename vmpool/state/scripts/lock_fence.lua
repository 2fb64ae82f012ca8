-- lock_fence.lua: take a lock and issue its fencing token, in one unit.
-- Not a store script: vmpool/state/locks.py loads it alone (FencedLock.acquire).
-- KEYS[1]  the lock key (keys.lock(kind, subject)); its value is the holder's lock id
-- KEYS[2]  the fence counter (keys.request_fence(rid) or keys.vm_fence(name))
-- KEYS[3]  the subject's record (keys.request(rid) or keys.vm(name)), for the TTL
-- ARGV[1]  the holder's lock id (fresh per grant)
-- ARGV[2]  TTL in ms for a counter whose subject has no record ('' for none)
-- ARGV[3]  the lock's expiry in ms
-- Returns: the new token (>= 1), or 0 when another holder has the lock (nothing written).
-- Invariant: a token is issued only together with the lock (SET NX in the same unit),
-- so tokens increase in grant order: a holder whose lock expired (and was granted
-- again) holds a smaller token than the new owner, and every fenced store transition
-- refuses it ('stale_fence'). The counter never goes back while its subject's record
-- exists: it gets a TTL only when it has none and its subject has one (a tombstone:
-- the counter dies with it) or has no record at all.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[3]) then
  return 0
end
local token = redis.call('INCR', KEYS[2])
if redis.call('PTTL', KEYS[2]) < 0 then
  local subject_ttl = redis.call('PTTL', KEYS[3])
  if subject_ttl > 0 then
    redis.call('PEXPIRE', KEYS[2], subject_ttl)
  elseif subject_ttl == -2 and ARGV[2] ~= '' then
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
  end
end
return token
