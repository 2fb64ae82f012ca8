-- lock_extend.lua: extend a lock its holder still owns, or release it.
-- Not a store script: vmpool/state/locks.py loads it alone.
-- KEYS[1]  the lock key (keys.lock(kind, subject))
-- ARGV[1]  the holder's lock id
-- ARGV[2]  the new expiry in ms, or '0' to release (delete) the lock
-- Returns: 1 when the caller owned the lock (extended or released), 0 otherwise.
-- Invariant: only the owner's id extends or deletes the key, in the same unit that
-- checks the ownership: a holder whose lock expired and went to another never
-- touches the new owner's lock.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == '0' then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
