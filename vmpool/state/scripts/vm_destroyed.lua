-- vm_destroyed.lua: the provider destroyed the VM (completed | on_hold -> destroyed).
-- The record stays as a tombstone for data_ttl, and at least as long as its request's
-- trail, so its name is not reused (keep_tombstone in _prelude.lua).
-- KEYS: 1-8 as in _prelude.lua.
-- ARGV: 1-4 as in _prelude.lua; 5 VM name; 6 fencing token of the VM's lock ('');
--   7 the address index (Keys.addresses): the VM's address leaves it.
-- Returns: {1, 'destroyed', version} or {0, 'no_vm' | 'wrong_request' |
--   'stale_fence' | 'vm_<state>'}.
-- Invariant: only a VM already released (completed, or on hold) is recorded destroyed; a running
-- VM of a live request can never be marked destroyed.
local vm, refusal = load_vm_in(ARGV[6], 'completed', 'on_hold')
if refusal then
  return refusal
end
local now = server_now()
local from = vm.state
move_vm(KEYS[7], vm, 'destroyed', now, now, '')
redis.call('HSET', KEYS[7], 'destroyed_at', fmt(now))
forget_address(vm, ARGV[7])
-- the record is a tombstone now; its fence counter lives exactly as long
keep_tombstone(KEYS[7], KEYS[8], vm.data_ttl)
if not request_of(vm) then
  return {1, 'destroyed', -1}
end
return {1, 'destroyed', audit('vm:' .. vm.name, from, 'destroyed', 'destroyed', now)}
