-- pool_vm_failed.lua: a warm-pool VM failed to be created or to boot (reserved |
-- pending -> completed). No retry of its own: the next top-up replaces it.
-- KEYS: the pool layout (_pool.lua).
-- ARGV: 1-4 as in _prelude.lua (4 is ''); 5 VM name; 6 fencing token of the VM's lock;
--   7 reason; 8 '1' when permanent (recorded only); 9 seconds to keep a booted VM on
--   hold for debugging ('0': completed at once).
-- Returns: {1, 'completed' | 'on_hold', version} or {0, 'no_vm' | 'wrong_request' |
--   'stale_fence' | 'vm_<state>'}.
-- Invariant: only a VM still being made fails; a paused lock holder is refused.
local vm, refusal = load_vm_in(ARGV[6], 'reserved', 'pending')
if refusal then
  return refusal
end
local now = server_now()
local from = vm.state
local to = fail_vm(vm, now, ARGV[7], tonumber(ARGV[9]))
return {1, to, audit('vm:' .. vm.name, from, to, ARGV[7], now)}
