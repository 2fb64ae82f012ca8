-- pool_recycle.lua: a ready VM leaves its pool for destruction (ready -> completed):
-- it waited past the pool's ready_ttl, or failed its check.
-- KEYS: the pool layout (_pool.lua).
-- ARGV: 1-4 as in _prelude.lua (4 is ''); 5 VM name; 6 reason; 7 the least time in
--   seconds it must have been ready ('' for none: a failed check).
-- Returns: {1, 'completed', version} or {0, 'no_vm' | 'wrong_request' | 'vm_<state>' |
--   'not_due'}.
-- Invariant: only a VM nobody holds is recycled (a claim in between wins: the VM is
-- running then, and refused here); the ready_ttl is judged on the server clock.
local vm, refusal = load_vm_in('', 'ready')
if refusal then
  return refusal
end
local now = server_now()
if ARGV[7] ~= '' and now - tonumber(vm.ready_at) < tonumber(ARGV[7]) then
  return refuse('not_due')
end
move_vm(KEYS[7], vm, 'completed', now, now, ARGV[6])
return {1, 'completed', audit('vm:' .. vm.name, 'ready', 'completed', ARGV[6], now)}
