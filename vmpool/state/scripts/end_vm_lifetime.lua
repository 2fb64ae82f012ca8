-- end_vm_lifetime.lua: a running VM reached the end of its lifetime (running ->
-- completed).
-- KEYS: 1-8 as in _prelude.lua.
-- ARGV: 1-4 as in _prelude.lua; 5 VM name; 6 '1' to end it now whatever its
--   lifetime (operator action), else '0'; 7 the reason ('' for 'lifetime ended';
--   reconcile's 'vanished at the provider').
-- Returns: {1, 'completed', version} or {0, 'no_vm' | 'wrong_request' | 'vm_<state>' |
--   'not_expired'}.
-- Invariant: a VM of a ready request is destroyed only after the request is deleted or
-- the VM's own lifetime (read from its record, against the server clock) is over.
-- A VM attached to a request that is still pending (its lifetime, counted from its own
-- ready time, ran out before the last VM booted) gives its slot back in the same unit:
-- the request's `have` counts live attached VMs only, so the request never turns ready
-- (vm_ready, expire_request) with fewer live VMs than asked, and a replacement may be
-- reserved while the request's time lasts.
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
local req = request_of(vm)
if not req then
  return {1, 'completed', -1}
end
if req.status == 'pending' then
  local slot = vm.alias .. ':' .. vm.pool
  redis.call('HINCRBY', KEYS[1], 'have:' .. slot, -1)
  redis.call('HINCRBY', KEYS[1], 'have', -1)
  redis.call('HINCRBY', KEYS[1], 'live:' .. slot, -1)
  redis.call('HINCRBY', KEYS[1], 'unreserved', 1)
  redis.call('ZADD', KEYS[6], line_score(req), RID)
end
return {1, 'completed', audit('vm:' .. vm.name, 'running', 'completed', why, now)}
