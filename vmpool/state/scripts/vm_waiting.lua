-- vm_waiting.lua: a reserved VM waits (its provider's cloud answered quota or "no
-- capacity"): no transition, only the cloud's words where a user will read them.
-- KEYS: 1-8 as in _prelude.lua for a request's VM, the pool layout (_pool.lua) for a
--   warm-pool VM (ARGV[4] '').
-- ARGV: 1-4 as in _prelude.lua; 5 VM name; 6 fencing token of the VM's lock; 7 reason.
-- Returns: {1, 'waiting'} or {0, 'no_vm' | 'wrong_request' | 'stale_fence' | 'vm_<state>'}.
-- Invariant: only a reserved VM, by its current lock holder, is noted; the VM stays
-- reserved and its request's retries are not touched. The request's `last_error` is
-- what its failure (by TTL) reports as the last real cause.
local vm, refusal = load_vm_in(ARGV[6], 'reserved')
if refusal then
  return refusal
end
redis.call('HSET', KEYS[7], 'error', ARGV[7])
if RID ~= '' then
  local req = request_of(vm)
  if req and req.status == 'pending' then
    redis.call('HSET', KEYS[1], 'last_error', ARGV[7])
  end
end
return {1, 'waiting'}
