-- vm_ready.lua: the provider says the VM booted. Attach it to its request and fulfil
-- the request if it was the last one, or send it to destruction.
-- KEYS: 1-8 as in _prelude.lua.
-- ARGV: 1-4 as in _prelude.lua; 5 VM name; 6 fencing token of the VM's lock ('');
--   7 the hostname the client is to get (the cloud's address), '' to keep the one
--   reserve_vm wrote (name.domain); 8 the cloud's address ('' when it reported none);
--   9 the address index (Keys.addresses), '' to leave it.
-- Returns: {1, 'running' | 'fulfilled', version} when attached; {1, 'completed',
--   version} when the request is not pending, or its time (TTL + grace) is up, in
--   which case the request is failed here and all its VMs released; or
--   {0, 'no_vm' | 'wrong_request' | 'stale_fence' | 'vm_<state>'}.
-- Invariant: a VM is attached only to a pending request within its time, in the same
-- unit that checks it; a terminal request is never resurrected by a late VM; the
-- request turns ready in the same unit as its last VM, never on a later sweep.
-- Metrics: an attached VM adds its ready time (now - reserved_at) to its pool's
-- histogram; a fulfilled (or, past its time, failed) request counts as finished.
local vm, refusal = load_vm_in(ARGV[6], 'pending')
if refusal then
  return refusal
end
local now = server_now()
local req = request_of(vm)
if not req or req.status ~= 'pending' then
  local why = 'request ' .. ((req and req.status) or 'missing')
  move_vm(KEYS[7], vm, 'completed', now, now, why)
  if not req then
    return {1, 'completed', -1}
  end
  return {1, 'completed', audit('vm:' .. vm.name, 'pending', 'completed', why, now)}
end
if now >= tonumber(req.fail_at) then
  -- The request's time is up and this VM is not attached, so it cannot be complete
  -- unless it already was: expire it here rather than leave it to the sweep.
  local _, v = expire_or_fulfil(req, now)
  return {1, 'completed', v}
end
local lifetime_end = now + tonumber(req.lifetime)
local fields = {'ready_at', fmt(now), 'lifetime_end', fmt(lifetime_end)}
if ARGV[7] and ARGV[7] ~= '' then
  fields[5], fields[6] = 'hostname', ARGV[7]
end
move_vm(KEYS[7], vm, 'running', now, fmt(lifetime_end), '', fields)
record_address(KEYS[7], vm.name, ARGV[8], ARGV[9])
if vm.reserved_at then
  observe_ready_time(vm.pool, math.max(0, now - tonumber(vm.reserved_at)))
end
local slot = vm.alias .. ':' .. vm.pool
-- the request's counts, read in this unit, written back in the one HSET of its version
-- (and status): nothing bumped the version since request_of read it
req.have = (tonumber(req.have) or 0) + 1
local known = {version = req.version, fields = {'have:' .. slot,
  (tonumber(req['have:' .. slot]) or 0) + 1, 'have', req.have}}
local entry = {'vm:' .. vm.name, 'pending', 'running', 'ready'}
-- `have` counts the request's live attached VMs: end_vm_lifetime takes back a VM whose
-- lifetime ended while the request was pending, so this never fulfils a request short.
if tonumber(req.have) >= tonumber(req.need) then
  -- the VM's entry, then the request's; the VM is alive (running): it has no TTL
  return {1, 'fulfilled', fulfil(req, now, entry, known, vm.name)}
end
return {1, 'running',
  audit_entries_at(KEYS[1], KEYS[3], {entry}, now, known.fields, known.version)}
