-- vm_created.lua: the provider created the VM; it is booting (reserved -> pending).
-- KEYS: 1-8 as in _prelude.lua.
-- ARGV: 1-4 as in _prelude.lua; 5 VM name; 6 fencing token of the VM's lock ('').
-- Returns: {1, 'pending', version}; {1, 'completed', version} when the request is no
--   longer pending (the caller's VM goes to destruction, never to the request); or
--   {0, 'no_vm' | 'wrong_request' | 'stale_fence' | 'vm_<state>'}.
-- Invariant: a VM created for a request that went terminal meanwhile is destroyed,
-- not attached. A refusal with 'vm_completed' tells the creator that the request let
-- go of this VM while the provider worked: the creator must destroy what it made.
local vm, refusal = load_vm_in(ARGV[6], 'reserved')
if refusal then
  return refusal
end
local now = server_now()
local req = request_of(vm)
if req and req.status == 'pending' then
  move_vm(KEYS[7], vm, 'pending', now, now, '')
  redis.call('HSET', KEYS[7], 'created_at', fmt(now))
  return {1, 'pending', audit('vm:' .. vm.name, 'reserved', 'pending', 'created', now)}
end
local why = 'request ' .. ((req and req.status) or 'missing')
move_vm(KEYS[7], vm, 'completed', now, now, why)
if not req then
  return {1, 'completed', -1}
end
return {1, 'completed', audit('vm:' .. vm.name, 'reserved', 'completed', why, now)}
