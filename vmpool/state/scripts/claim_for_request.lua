-- claim_for_request.lua: an on-demand request takes ready VMs of its pools first
-- (ready -> running, attached to the request); only the shortfall is cloned.
-- KEYS: 1-6 as in _prelude.lua (the request layout).
-- ARGV: 1-4 as in _prelude.lua; 5 the pools that lend ready VMs to requests,
--   comma-separated; 6 the user's max_vms, 7 max_cores ('' for no limit); 8 the cores
--   of one VM of each pool ("pool=n,...") (vmpool/state/quotas.py).
-- Returns: {1, 'claimed' | 'fulfilled', version, name, ...} or {0, 'no_request' |
--   'request_<status>' | 'past_deadline' | 'quota_max_vms' | 'quota_max_cores' |
--   'none_ready'}.
-- Invariant: a ready VM goes to one holder only (it leaves the ready set in the unit
-- that attaches it); a request never holds more VMs in a slot than it asked for (the
-- slot's live count bounds the claim, as reserve_vm's does); nothing is claimed for a
-- request that is not pending or whose TTL has passed; the request turns ready in the
-- unit that attaches its last VM. Each claim is in both trails: the VM's own (its last
-- entry) and the request's (its first). The request's user never holds more than their
-- quota: as in reserve_vm, the request takes VMs only while all it still needs fits,
-- and each VM claimed counts for the user in this unit.
local req = load_hash(KEYS[1])
if not req then
  return refuse('no_request')
end
if req.status ~= 'pending' then
  return refuse('request_' .. req.status)
end
local now = server_now()
if now >= tonumber(req.deadline) then
  return refuse('past_deadline')
end
local user = req.token_user or ''
local over = quota_over(user, tonumber(req.unreserved), quota_missing_cores(req, ARGV[8]),
  ARGV[6], ARGV[7])
if over ~= '' then
  return refuse('quota_' .. over)
end
local cores_of = {}
for pool, n in string.gmatch(ARGV[8] or '', '([^=,]+)=(%d+)') do
  cores_of[pool] = tonumber(n)
end
local lending = {}
for pool in string.gmatch(ARGV[5], '[^,]+') do
  lending[pool] = true
end
local lifetime_end = now + tonumber(req.lifetime)
local trail_ms = math.floor(tonumber(req.data_ttl) * 1000)
local claimed = {}
for alias, pool in string.gmatch(req.requested, '([^:,]+):([^:,]+):%d+') do
  local slot = alias .. ':' .. pool
  local missing = tonumber(req['want:' .. slot]) - tonumber(redis.call('HGET', KEYS[1], 'live:' .. slot))
  if lending[pool] and missing > 0 then
    for _, name in ipairs(redis.call('ZRANGE', pool_index(pool, 'ready'), 0, missing - 1)) do
      local vm_key = VM_PREFIX .. name
      local vm = load_hash(vm_key)
      if vm and vm.state == 'ready' and vm.request_id == '' then
        audit_at(vm_key, vm_trail(vm_key), 'vm:' .. name, 'ready', 'running',
          'claimed by request ' .. RID, now)
        redis.call('PEXPIRE', vm_trail(vm_key), trail_ms)
        vm.quota_user = user
        vm.cores = vm.cores or cores_of[pool] or 1
        move_vm(vm_key, vm, 'running', now, fmt(lifetime_end), '')
        redis.call('HSET', vm_key, 'request_id', RID, 'request_created', req.created,
          'alias', alias, 'data_ttl', req.data_ttl, 'checkout_at', fmt(now),
          'lifetime_end', fmt(lifetime_end), 'quota_user', user, 'cores', vm.cores)
        redis.call('SADD', KEYS[2], name)
        redis.call('HINCRBY', KEYS[1], 'live:' .. slot, 1)
        redis.call('HINCRBY', KEYS[1], 'have:' .. slot, 1)
        req.have = redis.call('HINCRBY', KEYS[1], 'have', 1)
        req.claimed = redis.call('HINCRBY', KEYS[1], 'claimed', 1)
        if redis.call('HINCRBY', KEYS[1], 'unreserved', -1) <= 0 then
          redis.call('ZREM', KEYS[6], RID)
          slot_line_leave(RID)
        end
        audit('vm:' .. name, 'ready', 'running', 'claimed from the pool', now)
        table.insert(claimed, name)
      end
    end
  end
end
if #claimed == 0 then
  return refuse('none_ready')
end
line_started(KEYS[1], KEYS[6], now)
local code, v = 'claimed', tonumber(redis.call('HGET', KEYS[1], 'version'))
if tonumber(req.have) >= tonumber(req.need) then
  code, v = 'fulfilled', fulfil(req, now)
end
local out = {1, code, v}
for _, name in ipairs(claimed) do
  table.insert(out, name)
end
return out
