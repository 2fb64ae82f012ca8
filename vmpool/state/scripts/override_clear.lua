-- override_clear.lua: DELETE /config/poolsize/<pool> | /config/pooltemplate/<pool>, and
-- `vmpool pools --reset-size`: drop a pool's runtime value of one setting (back to the
-- configured one).
-- KEYS: 1 the setting's override hash (Keys.pool_override).
-- ARGV: 1 the pool.
-- Returns: the value the pool had (false, a nil reply, when it had none).
-- Invariant: the value answered is the one removed (read and removed in one unit). A
-- script, so that the change is confirmed as every acknowledged write is
-- (vmpool/state/durability.py) and answered once per operation id (_once.lua): the
-- repeat of a lost reply answers the value the first run removed, not "none".
local before = redis.call('HGET', KEYS[1], ARGV[1])
if before then
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return before
