-- fleet_mark.lua: an operator's word on one of the fleet's marks: adopt or forget it
-- (`vmpool fleet-id adopt|forget`, vmpool/state/fleet_identity.py).
-- KEYS[1]  the identity (string, Keys.fleet_identity)
-- KEYS[2]  the fleet's other marks (hash mark -> role, Keys.fleet_marks)
-- ARGV[1]  'adopt' (the fleet owns every VM under the mark) or 'forget' (it lists them
--          no more)
-- ARGV[2]  the mark
-- returns  'adopted' | 'forgotten' | 'identity' (the mark is the identity: refused) |
--          'unknown' (forget: the fleet has no such mark)
-- invariant: the identity itself is never adopted or forgotten, so this never changes
--   the mark new VMs get, and no running process takes it for a loss.
if redis.call('GET', KEYS[1]) == ARGV[2] then
  return 'identity'
end
if ARGV[1] == 'adopt' then
  redis.call('HSET', KEYS[2], ARGV[2], 'adopted')
  return 'adopted'
end
if redis.call('HDEL', KEYS[2], ARGV[2]) == 0 then
  return 'unknown'
end
return 'forgotten'
