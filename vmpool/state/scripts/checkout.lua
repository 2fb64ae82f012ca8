-- checkout.lua: vmpooler's checkout (POST /vm/<pool>+<pool>): ready VMs of several
-- pools handed to one client, all or nothing (ready -> running).
-- KEYS: none declared: the ready sets and VMs are reached through ARGV[1] and ARGV[2]
--   (single primary, as every store script).
-- ARGV: 1-4 as in _prelude.lua (4 is ''); 5 owner (the token's user, '' for none);
--   6 the owner's token hash ('' for none); 7 lifetime seconds; 8 counts
--   "pool:n,pool:n" (each pool once); 9 what the caller asked, in its own terms
--   (opaque here, '' for nothing): returned, so that the repeat of an operation
--   (_once.lua) answers in the first call's terms; 10 the owner's max_vms, 11 max_cores
--   ('' for no limit) (vmpool/state/quotas.py).
-- Returns: {1, 'checked_out', ARGV[9], name, pool, name, pool, ...} or {0, 'short', pool}
--   (that pool has fewer ready VMs than asked: nothing was handed out) or
--   {0, 'index_out_of_step', name} or {0, 'quota_max_vms' | 'quota_max_cores', held}
--   (the owner holds ``held`` VMs, or cores, and the VMs asked would pass the quota:
--   nothing was handed out).
-- Invariant: a ready VM goes to exactly one client however many API processes race (one
-- unit takes it out of the ready set); every VM is chosen and checked before the first
-- is moved, so a claim short in any pool hands out nothing and no partial claim is ever
-- visible. The VM's lifetime starts now (server clock). The owner never holds more VMs
-- (or cores) than their quota: checked over all the VMs chosen before the first moves,
-- and each counted for the owner in this unit (_quota.lua).
local chosen = {}
for pool, n in string.gmatch(ARGV[8], '([^:,]+):(%d+)') do
  local count = tonumber(n)
  local names = {}
  if count > 0 then
    names = redis.call('ZRANGE', pool_index(pool, 'ready'), 0, count - 1)
  end
  if #names < count then
    return {0, 'short', pool}
  end
  for _, name in ipairs(names) do
    local vm_key = VM_PREFIX .. name
    local vm = load_hash(vm_key)
    if not vm or vm.state ~= 'ready' or vm.request_id ~= '' then
      return {0, 'index_out_of_step', name}
    end
    table.insert(chosen, {vm_key, vm})
  end
end
local cores = 0
for _, pair in ipairs(chosen) do
  cores = cores + (tonumber(pair[2].cores or '') or 1)
end
local over = quota_over(ARGV[5], #chosen, cores, ARGV[10], ARGV[11])
if over ~= '' then
  local held_vms, held_cores = quota_held(ARGV[5])
  return {0, 'quota_' .. over, over == 'max_vms' and held_vms or held_cores}
end
local now = server_now()
local lifetime_end = now + tonumber(ARGV[7])
local who = ARGV[5]
if who == '' then
  who = 'anonymous'
end
local out = {1, 'checked_out', ARGV[9] or ''}
for _, pair in ipairs(chosen) do
  local vm_key, vm = pair[1], pair[2]
  vm.quota_user = ARGV[5]
  move_vm(vm_key, vm, 'running', now, fmt(lifetime_end), '')
  redis.call('HSET', vm_key, 'owner', ARGV[5], 'owner_token', ARGV[6],
    'checkout_at', fmt(now), 'lifetime_end', fmt(lifetime_end), 'quota_user', ARGV[5])
  audit_at(vm_key, vm_trail(vm_key), 'vm:' .. vm.name, 'ready', 'running',
    'checked out by ' .. who, now)
  table.insert(out, vm.name)
  table.insert(out, vm.pool)
end
return out
