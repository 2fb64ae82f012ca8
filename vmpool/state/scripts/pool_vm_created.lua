-- pool_vm_created.lua: the provider created a warm-pool VM (reserved -> pending).
-- KEYS: the pool layout (_pool.lua).
-- ARGV: 1-4 as in _prelude.lua (4 is ''); 5 VM name; 6 fencing token of the VM's lock;
--   7 the clone limit: the VM's clone slot is given back in this unit ('' keeps it).
-- Returns: {1, 'pending', version, turn...} (turn...: as vm_created.lua's) or
--   {0, 'no_vm' | 'wrong_request' | 'stale_fence' | 'vm_<state>'}.
-- Invariant: only a reserved VM of no request moves; a paused lock holder is refused.
-- The clone slot is given back as vm_created.lua gives it back.
local vm, refusal = load_vm_in(ARGV[6], 'reserved')
if refusal then
  return refusal
end
local now = server_now()
move_vm(KEYS[7], vm, 'pending', now, now, '', {'created_at', fmt(now)})
local reply = {1, 'pending', audit('vm:' .. vm.name, 'reserved', 'pending', 'created', now)}
return slot_give_back(reply, vm.name, ARGV[6], ARGV[7], now)
