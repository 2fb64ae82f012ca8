-- vm_created.lua: the provider created the VM; it is booting (reserved -> pending).
-- KEYS: 1-8 as in _prelude.lua.
-- ARGV: 1-4 as in _prelude.lua; 5 VM name; 6 fencing token of the VM's lock ('');
--   7 the clone limit: the VM's clone slot is given back in this unit ('' keeps it).
-- Returns: {1, 'pending', version, turn...}; {1, 'completed', version, turn...} when
--   the request is no longer pending (the caller's VM goes to destruction, never to the
--   request); or {0, 'no_vm' | 'wrong_request' | 'stale_fence' | 'vm_<state>'}.
--   turn...: with ARGV 7, when the slot was given back, the requests whose turn for a
--   slot it is now (_slots.lua slot_turns), whose provision the caller dispatches.
-- Invariant: a VM created for a request that went terminal meanwhile is destroyed,
-- not attached. A refusal with 'vm_completed' tells the creator that the request let
-- go of this VM while the provider worked: the creator must destroy what it made. The
-- clone slot is given back with the move that ends the clone, by its holder only (the
-- fence's token, as the semaphore's release), once: a repeat answers the first reply.
local vm, refusal = load_vm_in(ARGV[6], 'reserved')
if refusal then
  return refusal
end
local now = server_now()
local req = request_of(vm)
local reply
if req and req.status == 'pending' then
  move_vm(KEYS[7], vm, 'pending', now, now, '', {'created_at', fmt(now)})
  reply = {1, 'pending', audit('vm:' .. vm.name, 'reserved', 'pending', 'created', now)}
else
  local why = 'request ' .. ((req and req.status) or 'missing')
  move_vm(KEYS[7], vm, 'completed', now, now, why)
  local v = -1
  if req then
    v = audit('vm:' .. vm.name, 'reserved', 'completed', why, now)
  end
  reply = {1, 'completed', v}
end
return slot_give_back(reply, vm.name, ARGV[6], ARGV[7], now)
