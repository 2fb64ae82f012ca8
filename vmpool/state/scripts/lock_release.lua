-- lock_release.lua: delete the locks their holder still owns (one lock, or the locks of
-- a batch job's claim at once, each checked on its own).
-- Not a store script: vmpool/state/locks.py loads it alone.
-- KEYS     the lock keys (keys.lock(kind, subject))
-- ARGV[i]  the holder's lock id of KEYS[i]
-- Returns: how many of the locks the caller owned (and so deleted); for one lock 1 or 0.
-- Invariant: only the owner's id deletes a key, in the same unit that checks the
-- ownership: a holder whose lock expired and went to another never releases the new
-- owner's lock.
local n = 0
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i] then
    redis.call('DEL', key)
    n = n + 1
  end
end
return n
