-- fleet_identity.lua: the fleet's identity, kept or made, and the marks it replaced
-- (vmpool/state/fleet_identity.py).
-- KEYS[1]  the identity (string, Keys.fleet_identity)
-- KEYS[2]  the fleet's other marks (hash mark -> role, Keys.fleet_marks)
-- ARGV[1]  a new identity, kept only when Redis holds none
-- ARGV[2]  the key prefix: the mark of the versions that kept no identity
-- ARGV[3]  '1' when VM records exist (the caller looked): a Redis such a version used
-- ARGV[4]  the identity the calling process held ('' when it holds none yet)
-- returns  {identity, the held identity when this call recorded it lost else '',
--           HGETALL of KEYS[2]...}
-- invariant: the identity is never the key prefix (every install with the default prefix
--   would share it), and it never changes under a process silently: when the identity a
--   process held is no longer Redis's, that mark is in KEYS[2] ('lost' unless an
--   operator gave it a role), so no VM under it is destroyed as a leak or forgotten.
local identity = redis.call('GET', KEYS[1])
if identity == ARGV[2] then
  redis.call('HSETNX', KEYS[2], identity, 'legacy')
  identity = false
end
if not identity then
  if ARGV[3] == '1' then
    redis.call('HSETNX', KEYS[2], ARGV[2], 'legacy')
  end
  identity = ARGV[1]
  redis.call('SET', KEYS[1], identity)
end
local noticed = ''
local held = ARGV[4]
if held ~= '' and held ~= identity and redis.call('HEXISTS', KEYS[2], held) == 0 then
  redis.call('HSET', KEYS[2], held, 'lost')
  noticed = held
end
return {identity, noticed, redis.call('HGETALL', KEYS[2])}
