-- pool_end_lifetime.lua: a checked-out VM reached the end of its lifetime (running ->
-- completed).
-- KEYS: the pool layout (_pool.lua).
-- ARGV: 1-4 as in _prelude.lua (4 is ''); 5 VM name; 6 '1' to end it now whatever its
--   lifetime (operator action), else '0'; 7 the reason ('' for 'lifetime ended';
--   reconcile's 'vanished at the provider').
-- Returns: {1, 'completed', version} or {0, 'no_vm' | 'wrong_request' | 'vm_<state>' |
--   'not_expired'}.
-- Invariant: a held VM is reaped only once its own lifetime (server clock) is over.
local vm, refusal = load_vm_in('', 'running')
if refusal then
  return refusal
end
local now = server_now()
if ARGV[6] ~= '1' and now < tonumber(vm.lifetime_end) then
  return refuse('not_expired')
end
local why = (ARGV[7] and ARGV[7] ~= '') and ARGV[7] or 'lifetime ended'
move_vm(KEYS[7], vm, 'completed', now, now, why)
return {1, 'completed', audit('vm:' .. vm.name, 'running', 'completed', why, now)}
