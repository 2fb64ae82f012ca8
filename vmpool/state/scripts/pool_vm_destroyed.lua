-- pool_vm_destroyed.lua: the provider destroyed a warm-pool VM (completed |
-- on_hold -> destroyed); its record, fence and trail stay as a tombstone for data_ttl.
-- KEYS: the pool layout (_pool.lua).
-- ARGV: 1-4 as in _prelude.lua (4 is ''); 5 VM name; 6 fencing token of the VM's lock;
--   7 the address index (Keys.addresses): the VM's address leaves it.
-- Returns: {1, 'destroyed', version} or {0, 'no_vm' | 'wrong_request' | 'stale_fence'
--   | 'vm_<state>'}.
-- Invariant: only a released VM is recorded destroyed; its name is never reused.
local vm, refusal = load_vm_in(ARGV[6], 'completed', 'on_hold')
if refusal then
  return refusal
end
local now = server_now()
local from = vm.state
move_vm(KEYS[7], vm, 'destroyed', now, now, '')
redis.call('HSET', KEYS[7], 'destroyed_at', fmt(now))
forget_address(vm, ARGV[7])
local v = audit('vm:' .. vm.name, from, 'destroyed', 'destroyed', now)
keep_pool_tombstone(vm)
return {1, 'destroyed', v}
