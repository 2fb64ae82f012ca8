-- pool_reset.lua: POST /poolreset, `vmpool pools reset POOL`, and a pool's template or
-- clone target changed at runtime: its ready VMs leave for destruction (ready ->
-- completed) and the reset time is recorded, so that no VM reserved before it becomes
-- ready (pool_vm_ready.lua); the pool's top-up replaces them.
-- KEYS: none (the VMs through ARGV[1-2]'s prefixes, the reset times: POOL_RESETS).
-- ARGV: 1-4 as in _prelude.lua (4 is ''); 5 pool.
-- Returns: {1, 'reset', n, name, ...}: the n VMs sent to destruction.
-- Invariant: only a ready VM nobody holds is recycled: a checked-out VM, or one a
-- request claimed, is running and never touched; each move is in the VM's own trail.
local pool = ARGV[5]
local now = server_now()
redis.call('HSET', POOL_RESETS, pool, fmt(now))
local out = {1, 'reset', 0}
for _, name in ipairs(redis.call('ZRANGE', pool_index(pool, 'ready'), 0, -1)) do
  local key = VM_PREFIX .. name
  local vm = load_hash(key)
  if vm and vm.state == 'ready' and (vm.request_id or '') == '' then
    move_vm(key, vm, 'completed', now, now, 'pool reset')
    audit_at(key, vm_trail(key), 'vm:' .. name, 'ready', 'completed', 'pool reset', now)
    table.insert(out, name)
  end
end
out[3] = #out - 3
return out
