-- give_back.lua: the holder gives a VM back (DELETE /vm/<hostname>): running ->
-- completed, to be destroyed. The request holding it, if any, is left as it is.
-- KEYS: the pool layout (_pool.lua) for a checked-out VM, the request layout
--   (_prelude.lua, KEYS 1-8) for a VM a request holds.
-- ARGV: 1-4 as in _prelude.lua (4: the VM's request id, '' for none); 5 VM name;
--   6 the caller's user ('' for admin or auth off).
-- Returns: {1, 'completed', version} or {0, 'no_vm' | 'wrong_request' | 'vm_<state>'
--   | 'forbidden'}.
-- Invariant: only the holder (or admin) gives a VM back; only a held VM goes. A VM of
-- an on-demand request goes alone: the request is never resurrected, failed or
-- fulfilled by it, and keeps counting it as delivered (vmpooler's GET
-- /ondemandvm/<id> goes on listing it: the VM stays in the request's set, marked
-- given_back).
local vm, refusal = held_vm_for(ARGV[6])
if refusal then
  return refusal
end
local now = server_now()
move_vm(KEYS[7], vm, 'completed', now, now, 'given back')
redis.call('HSET', KEYS[7], 'given_back', '1')
if RID ~= '' and not request_of(vm) then
  return {1, 'completed', -1}
end
return {1, 'completed', audit('vm:' .. vm.name, 'running', 'completed', 'given back', now)}
