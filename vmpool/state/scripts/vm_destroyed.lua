-- vm_destroyed.lua: the provider destroyed the VM (completed -> destroyed). The record
-- stays as a tombstone for data_ttl so its name is not reused.
-- KEYS: 1-8 as in _prelude.lua.
-- ARGV: 1-4 as in _prelude.lua; 5 VM name; 6 fencing token of the VM's lock ('').
-- Returns: {1, 'destroyed', version} or {0, 'no_vm' | 'wrong_request' |
--   'stale_fence' | 'vm_<state>'}.
-- Invariant: only a VM already released (completed) is recorded destroyed; a running
-- VM of a live request can never be marked destroyed.
local vm, refusal = load_vm(ARGV[6])
if refusal then
  return refusal
end
if vm.state ~= 'completed' then
  return refuse('vm_' .. vm.state)
end
local now = server_now()
move_vm(KEYS[7], vm, 'destroyed', now, now, '')
redis.call('HSET', KEYS[7], 'destroyed_at', fmt(now))
-- the record is a tombstone now; its fence counter lives exactly as long
local ttl_ms = math.floor(tonumber(vm.data_ttl) * 1000)
redis.call('PEXPIRE', KEYS[7], ttl_ms)
redis.call('PEXPIRE', KEYS[8], ttl_ms)
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {1, 'destroyed', -1}
end
return {1, 'destroyed', audit('vm:' .. vm.name, 'completed', 'destroyed', 'destroyed', now)}
