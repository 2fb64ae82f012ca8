-- lock_fence.lua: issue a fencing token to the holder of a python-redis-lock lock.
-- Not a store script: vmpool/locks.py loads it alone, right after a lock is granted.
-- KEYS[1]  the lock key (keys.lock(kind, subject)); its value is the holder's lock id
-- KEYS[2]  the fence counter (keys.request_fence(rid) or keys.vm_fence(name))
-- KEYS[3]  the subject's record (keys.request(rid) or keys.vm(name)), for the TTL
-- ARGV[1]  the holder's lock id
-- ARGV[2]  TTL in ms for a counter whose subject has no record ('' for none)
-- Returns: the new token (>= 1), or 0 when the caller no longer owns the lock.
-- Invariant: a token is issued only to the current owner of the lock, in the same unit
-- that checks the ownership, so tokens increase in grant order: a holder whose lock
-- expired (and was granted again) holds a smaller token than the new owner, and every
-- fenced store transition refuses it ('stale_fence'). The counter never goes back while
-- its subject's record exists: it gets a TTL only when it has none and its subject
-- has one (a tombstone: the counter dies with it) or has no record at all.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
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
