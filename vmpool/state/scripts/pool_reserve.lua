-- pool_reserve.lua: the intent record of one warm-pool VM (none -> reserved), written
-- before the provider is called, only while the pool is short of its size.
-- KEYS: the pool layout (_pool.lua).
-- ARGV: 1-4 as in _prelude.lua (4 is ''); 5 VM name; 6 pool; 7 template (the pool's runtime
--   template wins: pool_template); 8 provider;
--   9 domain ('' for none); 10 the pool's size; 11 data_ttl seconds; 12 the cores of
--   one VM of the pool (what a checkout or claim of it counts against its user's quota);
--   13 the clone limit ('' to take no clone slot), 14 the slot's lease seconds
--   (vmpool/state/semaphore.py SlotTerms).
-- Returns: {1, 'reserved', version} or {0, 'name_taken' | 'pool_full' | 'clone_limit'}.
-- Invariant: a pool never holds more warm VMs (ready, plus its own reserved and
-- booting) than its size, however many top-up jobs run at once; a VM name is unique
-- across the fleet (a record or a trail, tombstones included, is never reused). With
-- ARGV 13, the VM is reserved only with a clone slot, taken in the same unit (token 0:
-- its create takes the lease over under the VM's lock).
if redis.call('EXISTS', KEYS[7], KEYS[3]) > 0 then
  return refuse('name_taken')
end
local pool = ARGV[6]
if warm_count(pool) >= tonumber(ARGV[10]) then
  return refuse('pool_full')
end
local now = server_now()
local name = ARGV[5]
if ARGV[13] and ARGV[13] ~= '' then
  local expiry = fmt(now + tonumber(ARGV[14]))
  if slot_acquire(name, 0, tonumber(ARGV[13]), expiry, now) == 0 then
    return refuse('clone_limit')
  end
end
local hostname = name
if ARGV[9] ~= '' then
  hostname = name .. '.' .. ARGV[9]
end
-- the record is written by the move's one HSET (its state with it)
move_vm(KEYS[7], {name = name, pool = pool, state = 'none'}, 'reserved', now, now, '', {'name', name,
  'request_id', '', 'alias', pool, 'pool', pool,
  'template', pool_template(pool, ARGV[7]), 'provider', ARGV[8], 'hostname', hostname, 'attempt', 1,
  'reserved_at', fmt(now), 'data_ttl', ARGV[11], 'version', 0,
  'cores', tonumber(ARGV[12] or '') or 1})
return {1, 'reserved', audit('vm:' .. name, 'none', 'reserved', 'reserved for the pool', now)}
