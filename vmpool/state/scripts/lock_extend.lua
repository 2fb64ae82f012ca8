-- lock_extend.lua: extend locks their holder still owns, or release them, or only check
-- that it owns them (one lock, or the locks of a batch job's claim at once, each
-- checked on its own).
-- Not a store script: vmpool/state/locks.py loads it alone.
-- KEYS     the lock keys (keys.lock(kind, subject))
-- ARGV[1]  the new expiry in ms, '0' to release (delete) the locks, or '' to write
--          nothing (an ownership check: no AOF write, so no fsync, for it)
-- ARGV[1+i] the holder's lock id of KEYS[i]
-- Returns: how many of the locks the caller owned (extended, released or checked); for
--          one lock 1 or 0.
-- Invariant: only the owner's id extends or deletes a key, in the same unit that
-- checks the ownership: a holder whose lock expired and went to another never
-- touches the new owner's lock.
local n = 0
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1 + i] then
    if ARGV[1] == '0' then
      redis.call('DEL', key)
    elseif ARGV[1] ~= '' then
      redis.call('PEXPIRE', key, ARGV[1])
    end
    n = n + 1
  end
end
return n
