-- login_failed.lua: count one failed login against its client address and its user.
--
-- KEYS[1]  the address's count (P:login-failures:address:<sha256>)
-- KEYS[2]  the user's count (P:login-failures:user:<sha256>)
-- ARGV[1]  the window in milliseconds
-- Returns  {address count, user count}
--
-- Invariant: every count carries a TTL (the window, from its first failure), so a
-- count never outlives its window and Redis keeps nothing for ever; the INCR and its
-- PEXPIRE are one unit, so no count is left without one.
local out = {}
for i, key in ipairs(KEYS) do
  local n = redis.call('INCR', key)
  if n == 1 or redis.call('PTTL', key) < 0 then
    redis.call('PEXPIRE', key, ARGV[1])
  end
  out[i] = n
end
return out
