-- override_set.lua: POST /config/poolsize | pooltemplate | clonetarget: set pools'
-- runtime values of one setting (vmpooler's vmpooler__config__<setting> hashes).
-- KEYS: 1 the setting's override hash (Keys.pool_override).
-- ARGV: pool, value, configured value, pool, value, configured value, ...
-- Returns: how many pools' effective value changed (vmpooler answers 201 when any did,
--   200 when none).
-- Invariant: the hash holds only values that differ from the configuration (a value
-- equal to the configured one removes the pool's entry), and each pool's change is
-- judged against its effective value in the same unit, however many callers race.
local changed = 0
for i = 1, #ARGV, 3 do
  local pool, value, configured = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local current = redis.call('HGET', KEYS[1], pool) or configured
  if current ~= value then
    changed = changed + 1
  end
  if value == configured then
    redis.call('HDEL', KEYS[1], pool)
  else
    redis.call('HSET', KEYS[1], pool, value)
  end
end
return changed
