-- pool_vm_ready.lua: a warm-pool VM booted: it joins its pool's ready set
-- (pending -> ready, score = ready time).
-- KEYS: the pool layout (_pool.lua).
-- ARGV: 1-4 as in _prelude.lua (4 is ''); 5 VM name; 6 fencing token of the VM's lock;
--   7 the hostname a checkout hands out (the cloud's address), '' to keep name.domain;
--   8 the cloud's address (''); 9 the address index (Keys.addresses), ''.
-- Returns: {1, 'ready', version}; {1, 'completed', version} for a VM reserved before
--   its pool's last reset (Keys.pool_resets: it goes to destruction, a new one replaces
--   it); or {0, 'no_vm' | 'wrong_request' | 'stale_fence' | 'vm_<state>'}.
-- Invariant: a VM enters the ready set only from booting, with no owner; the ready set
-- and the records agree; after a pool reset no VM reserved before it becomes ready.
-- Metrics: its ready time joins its pool's histogram.
local vm, refusal = load_vm_in(ARGV[6], 'pending')
if refusal then
  return refusal
end
local now = server_now()
local reset_at = redis.call('HGET', POOL_RESETS, vm.pool)
if reset_at and vm.reserved_at and tonumber(vm.reserved_at) < tonumber(reset_at) then
  -- reserved before its pool's reset (or template change): replaced, never ready
  move_vm(KEYS[7], vm, 'completed', now, now, 'pool reset')
  return {1, 'completed', audit('vm:' .. vm.name, 'pending', 'completed', 'pool reset', now)}
end
move_vm(KEYS[7], vm, 'ready', now, fmt(now), '', {'ready_at', fmt(now)})
if ARGV[7] and ARGV[7] ~= '' then
  redis.call('HSET', KEYS[7], 'hostname', ARGV[7])
end
record_address(KEYS[7], vm.name, ARGV[8], ARGV[9])
if vm.reserved_at then
  observe_ready_time(vm.pool, math.max(0, now - tonumber(vm.reserved_at)))
end
return {1, 'ready', audit('vm:' .. vm.name, 'pending', 'ready', 'ready in the pool', now)}
