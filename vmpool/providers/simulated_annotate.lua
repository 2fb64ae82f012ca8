-- simulated_annotate.lua: a snapshot or an extra disk of a simulated VM, and a revert
-- to a snapshot (SimulatedProvider.create_snapshot, add_disk, revert_snapshot),
-- recorded in the VM's hash.
-- KEYS: 1 the VM's hash (Keys.sim_vm).
-- ARGV: 1 the field (snapshot:<id> or disk:<label>); 2 its value (an add; '' for a
--   revert); 3 'add' or 'revert'.
-- Returns: 0 no such VM; 1 done (added, or reverted: `reverted_to` is the snapshot);
--   2 already there (an add writes nothing); 3 no such snapshot (a revert).
-- Invariant: a VM's hash is never recreated (a name is in the inventory iff its hash
-- exists); an add is idempotent by its field (the name the API chose).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
if ARGV[3] == 'revert' then
  if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
    return 3
  end
  redis.call('HSET', KEYS[1], 'reverted_to', ARGV[1])
  return 1
end
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return 2
end
return 1
