-- lock_extend.lua: push out the expiry of the locks their holder still owns.
-- Not a store script: vmpool/state/locks.py loads it alone (the renewer's call).
-- KEYS      the lock keys (keys.lock(kind, subject))
-- ARGV[1]   the new expiry in ms
-- ARGV[1+i] the holder's lock id of KEYS[i]
-- Returns: how many of the locks the caller owned (and so extended); for one lock 1 or 0.
-- Invariant: only the owner's id extends a key, in the same unit that checks the
-- ownership: a holder whose lock expired and went to another never extends the new
-- owner's lock.
local n = 0
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1 + i] then
    redis.call('PEXPIRE', key, ARGV[1])
    n = n + 1
  end
end
return n
