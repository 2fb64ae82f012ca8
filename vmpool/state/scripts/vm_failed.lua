-- vm_failed.lua: a create or a boot failed (reserved|pending -> completed). Within
-- max_vm_retries the slot is freed for a new reservation; past it, or on a permanent
-- error, the request fails and all its VMs are released.
-- KEYS: 1-8 as in _prelude.lua.
-- ARGV: 1-4 as in _prelude.lua; 5 VM name; 6 fencing token of the VM's lock ('');
--   7 reason; 8 '1' when the error is permanent (retrying cannot help), else '0';
--   9 seconds to keep a booted VM on hold for debugging ('0': completed at once).
-- Returns: {1, 'retry' | 'request_failed' | 'completed' | 'on_hold', version} or
--   {0, 'no_vm' | 'wrong_request' | 'stale_fence' | 'vm_<state>'}.
-- Invariant: only a pending request is failed (a ready one never); retries are counted
-- once per failed VM, however many workers report it.
-- Metrics: a request failed here counts as finished (failed) in this unit.
-- The reason becomes the request's last_error (what a later failure reports as its last
-- real cause), and the failure reason of a request it fails.
local vm, refusal = load_vm_in(ARGV[6], 'reserved', 'pending')
if refusal then
  return refusal
end
local now = server_now()
local from = vm.state
local reason = ARGV[7]
local to = fail_vm(vm, now, reason, tonumber(ARGV[9]))
local req = request_of(vm)
if not req then
  return {1, to, -1}
end
local v = audit('vm:' .. vm.name, from, to, reason, now)
if req.status ~= 'pending' then
  return {1, 'completed', v}
end
redis.call('HINCRBY', KEYS[1], 'live:' .. vm.alias .. ':' .. vm.pool, -1)
redis.call('HSET', KEYS[1], 'last_error', reason)
if ARGV[8] == '1' then
  return {1, 'request_failed', fail_request(req, 'Configuration error: ' .. reason, now)}
end
if tonumber(req.retries) >= tonumber(req.max_retries) then
  local why = 'Max retry attempts exceeded; last cause: ' .. reason
  return {1, 'request_failed', fail_request(req, why, now)}
end
redis.call('HINCRBY', KEYS[1], 'retries', 1)
redis.call('HINCRBY', KEYS[1], 'unreserved', 1)
redis.call('ZADD', KEYS[6], line_score(req), RID)
return {1, 'retry', v}
