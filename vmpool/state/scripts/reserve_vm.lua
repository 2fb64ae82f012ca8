-- reserve_vm.lua: the intent record of one VM, written before the provider is called.
-- KEYS: 1-8 as in _prelude.lua.
-- ARGV: 1-4 as in _prelude.lua; 5 VM name; 6 alias; 7 pool; 8 template (the pool's
--   runtime template wins: pool_template); 9 provider;
--   10 domain ('' for none); 11 fencing token of the request's lock ('' for none);
--   12 the user's max_vms, 13 max_cores ('' for no limit); 14 the cores of one VM of
--   each pool ("pool=n,...", a pool not named counts 1) (vmpool/state/quotas.py);
--   15 the clone limit ('' to take no clone slot), 16 the slot's lease seconds, 17 the
--   request's place in line (vmpool/state/semaphore.py SlotTerms).
-- Returns: {1, 'reserved', version} or {0, 'no_request' | 'stale_fence' |
--   'request_<status>' | 'past_deadline' | 'no_such_slot' | 'slot_full' | 'name_taken'
--   | 'quota_max_vms' | 'quota_max_cores' | 'clone_limit'}. 'clone_limit': no clone
--   slot is free in the request's turn; the request waits in the slot line (_slots.lua),
--   the one write of a refusal, which a repeat makes the same.
-- Invariant: a request never has more live VMs in a slot than it asked for; a VM name
-- is unique across the fleet (a record, tombstones included, is never reused; the one
-- EXISTS on the record also covers the trails naming it, because a tombstone is kept
-- at least as long as its request's trail: keep_tombstone, close_request); nothing
-- is reserved for a request that is not pending or whose TTL has passed; a paused lock
-- holder whose lock was granted again is refused. The request's user never holds more
-- VMs (or cores) than their quota (_quota.lua counts the VM in this unit), and a
-- request reserves only while all it still needs fits (held + its unreserved VMs): so
-- requests of one user that each hold part of their VMs are never all stuck waiting for
-- each other (the last one to reserve has room for its rest). With ARGV 15, the VM is
-- reserved only with a clone slot, taken in the same unit (token 0: its create takes
-- the lease over under the VM's lock), so no reservation outlives a refused slot and
-- no slot is left held by a refused reservation.
local req = load_hash(KEYS[1])
if not req then
  return refuse('no_request')
end
if not fence_ok(KEYS[4], ARGV[11]) then
  return refuse('stale_fence')
end
if req.status ~= 'pending' then
  return refuse('request_' .. req.status)
end
local now = server_now()
if now >= tonumber(req.deadline) then
  return refuse('past_deadline')
end
local slot = ARGV[6] .. ':' .. ARGV[7]
local want = tonumber(req['want:' .. slot])
if not want then
  return refuse('no_such_slot')
end
if tonumber(req['live:' .. slot]) >= want then
  return refuse('slot_full')
end
if redis.call('EXISTS', KEYS[7]) == 1 then
  return refuse('name_taken')
end
local user = req.token_user or ''
local over = quota_over(user, tonumber(req.unreserved), quota_missing_cores(req, ARGV[14]),
  ARGV[12], ARGV[13])
if over ~= '' then
  return refuse('quota_' .. over)
end
if ARGV[15] ~= '' then
  local expiry = fmt(now + tonumber(ARGV[16]))
  if slot_acquire_in_line(ARGV[5], 0, tonumber(ARGV[15]), expiry, now, RID, ARGV[17]) == 0 then
    return refuse('clone_limit')
  end
end
local cores = 1
for pool, n in string.gmatch(ARGV[14] or '', '([^=,]+)=(%d+)') do
  if pool == ARGV[7] then
    cores = tonumber(n)
  end
end
local name = ARGV[5]
local hostname = name
if ARGV[10] ~= '' then
  hostname = name .. '.' .. ARGV[10]
end
-- the record is written by the move's one HSET (its state with it)
move_vm(KEYS[7], {name = name, pool = ARGV[7], state = 'none', quota_user = user, cores = cores},
  'reserved', now, now, '', {'name', name, 'request_id', RID, 'alias', ARGV[6],
  'pool', ARGV[7], 'template', pool_template(ARGV[7], ARGV[8]), 'provider', ARGV[9], 'hostname', hostname,
  'attempt', tonumber(req.retries) + 1, 'reserved_at', fmt(now),
  'data_ttl', req.data_ttl, 'request_created', req.created,
  'quota_user', user, 'cores', cores})
redis.call('SADD', KEYS[2], name)
local unreserved = tonumber(req.unreserved) - 1
if unreserved <= 0 then
  redis.call('ZREM', KEYS[6], RID)
  slot_line_leave(RID)
end
-- the request's counts (and `started`, its first VM's), read in this unit, written back
-- in the one HSET of its version: nothing bumped the version since load_hash read it
local first = req.started == nil
local fields = {'live:' .. slot, tonumber(req['live:' .. slot]) + 1, 'unreserved', unreserved}
if first then
  fields[5], fields[6] = 'started', fmt(now)
end
line_started(KEYS[1], KEYS[6], now, first)
return {1, 'reserved', audit_entries_at(KEYS[1], KEYS[3],
  {{'vm:' .. name, 'none', 'reserved', 'reserved'}}, now, fields, req.version)}
