-- lock_check.lua: count the locks their holder still owns, writing nothing.
-- Not a store script: vmpool/state/locks.py loads it alone (FencedLock.ensure_held).
-- KEYS     the lock keys (keys.lock(kind, subject))
-- ARGV[i]  the holder's lock id of KEYS[i]
-- Returns: how many of the locks the caller owns; for one lock 1 or 0.
-- Invariant: a read only (no AOF write, so no fsync under appendfsync always); the
-- expiry stays the renewer's (lock_extend.lua).
local n = 0
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i] then
    n = n + 1
  end
end
return n
