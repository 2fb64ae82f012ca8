-- _prelude.lua: helpers shared by every store script. The store prepends the
-- transition tables (vmpool/state/transitions.py: REQUEST_EDGES, VM_EDGES), the metric
-- block (vmpool/state/counters.py lua_metrics: METRIC_FINISHED, METRIC_READY_PREFIX,
-- READY_BOUNDS, READY_FIELDS, READY_OVERFLOW, READY_SUM, METRIC_VMS,
-- POOL_FAILURES_PREFIX: the fleet's metric keys and the ready-time buckets), the
-- quotas' keys and helpers (vmpool/state/quotas.py, _quota.lua: quota_move,
-- observe_hist, observe_request_ready, quota_forget) and this file to each script body,
-- so every script enforces the same table and counts into the same keys.
--
-- SWEEP_PARKED and SWEEP_WAKE (vmpool.state.store_scripts.lua_wake) are rendered in too.
--
-- Calling convention of every store script:
--   KEYS[1] request hash      KEYS[2] request VM set    KEYS[3] request audit trail
--   KEYS[4] request fence     KEYS[5] open-request index (zset, score = fail_at)
--   KEYS[6] provision queue (zset, score = line_at: created less the priority's lead)
--   KEYS[7] VM hash           KEYS[8] VM fence          (VM scripts only)
--   ARGV[1] prefix of the per-pool VM indexes ("vmpool:pool:"; POOL:STATE appended)
--   ARGV[2] prefix of VM hashes ("vmpool:vm:"; NAME appended)
--   ARGV[3] actor (who asks: "api", "worker:<id>/<job>", "cli", ...)
--   ARGV[4] request id; script-specific arguments from ARGV[5] on.
-- The per-pool indexes and the VMs of a request are reached through the prefixes, not
-- declared keys: vmpool runs on a single primary, not on Redis Cluster.
--
-- Every script returns {1, code, version} when it changed something, {0, code} when it
-- refused; code says why. A refusal changes nothing.
--
-- Invariants protected here for all scripts: a missing record is never recreated
-- (every script loads and checks its hash first); a status only moves along an edge of
-- the table; every change bumps the request's version and appends one audit entry in
-- the same atomic unit; time is the Redis server's TIME, never the caller's clock.
-- The metrics (requests finished, ready times) are counted in the unit of the
-- transition they count, so they only grow, count each transition once, and a
-- refusal (which changes nothing) counts nothing.

local POOL_PREFIX = ARGV[1]
local VM_PREFIX = ARGV[2]
local ACTOR = ARGV[3]
local RID = ARGV[4]

local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function fmt(x)
  return string.format('%.6f', x)
end

local function refuse(code)
  return {0, code}
end

local function load_hash(key)
  local flat = redis.call('HGETALL', key)
  if #flat == 0 then
    return nil
  end
  local h = {}
  for i = 1, #flat, 2 do
    h[flat[i]] = flat[i + 1]
  end
  return h
end

-- A fencing token of '' means "not taken under a lock"; otherwise it must be at least
-- the newest grant, so a holder whose lock expired (and was granted again) is refused.
local function fence_ok(fence_key, token)
  if token == nil or token == '' then
    return true
  end
  local current = tonumber(redis.call('GET', fence_key) or '0')
  return tonumber(token) >= current
end

-- The opening of every VM script: the VM's record exists, belongs to the request the
-- caller named, and the caller's fencing token ('' when it holds no lock) is current.
-- Returns the VM, or nil and the refusal to return.
local function load_vm(token)
  local vm = load_hash(KEYS[7])
  if not vm then
    return nil, refuse('no_vm')
  end
  if vm.request_id ~= RID then
    return nil, refuse('wrong_request')
  end
  if not fence_ok(KEYS[8], token) then
    return nil, refuse('stale_fence')
  end
  return vm, nil
end

-- load_vm, and the VM is in ``state`` (or ``other``): the edge the script takes starts
-- there. Otherwise nil and 'vm_<its state>'.
local function load_vm_in(token, state, other)
  local vm, refusal = load_vm(token)
  if refusal then
    return nil, refusal
  end
  if vm.state ~= state and vm.state ~= (other or state) then
    return nil, refuse('vm_' .. vm.state)
  end
  return vm, nil
end

-- The request a VM belongs to, or nil when it is gone. A request id can be taken again
-- once every key of its old request expired (data_ttl), while a VM of the old request
-- may still be booting or waiting for destruction: reserve_vm stamps the request's
-- `created` time on the VM, and a request with another `created` is a stranger the VM
-- must neither attach to, count in, nor write into the trail of. (VMs reserved before
-- the stamp existed carry none and keep the old behaviour.)
local function request_of(vm)
  local req = load_hash(KEYS[1])
  if req and vm.request_created and req.created ~= vm.request_created then
    return nil
  end
  return req
end

-- A destroyed VM's record stays as a tombstone so its name is not reused; reserve_vm
-- checks only that record, which is correct because the tombstone is kept at least as
-- long as its request's trail (the only trail that names it): here, when the VM gets
-- its TTL, and in close_request, when the trail gets its TTL. A trail with no TTL yet
-- (the request is open) gets one at close_request, which extends this one.
local function keep_tombstone(vm_key, fence_key, data_ttl_s)
  local ms = math.floor(tonumber(data_ttl_s) * 1000)
  local trail_ms = redis.call('PTTL', KEYS[3])
  if trail_ms > ms then
    ms = trail_ms
  end
  redis.call('PEXPIRE', vm_key, ms)
  redis.call('PEXPIRE', fence_key, ms)
end

-- Appends one audit entry and bumps the request's version: contiguous versions are how
-- the audit proves no transition was lost or made twice.
-- The trail is a list of packed entries, one JSON array each
-- [entity, from, to, version, actor, reason, time] (vmpool.state.records.decode_trail
-- reads it): tens of bytes per entry, where a stream costs about 4 KB per request. A trail written as a stream by an older release (a request open across the
-- upgrade) keeps growing as a stream: RPUSH meets WRONGTYPE and XADD runs instead.
-- audit_at writes to any record's trail (a warm-pool VM's own: its hash and
-- Keys.vm_audit); audit to the script's own record (KEYS[1], trail KEYS[3]). The names
-- and arguments of these functions are their interface (other scripts call them);
-- audit_entry packs one entry (create_request writes its first entry itself).
local function audit_entry(entity, from, to, v, reason, now)
  return cjson.encode({entity, from, to, v, ACTOR, reason, fmt(now)})
end

-- audit_entries_at appends several entries ({entity, from, to, reason} each, in order)
-- with one version bump and one push, their versions contiguous as if appended one by
-- one; it returns the last version. ``fields``: more field, value pairs of the record
-- written with the bump (nil for none). ``version``: the record's version as read in
-- this unit with no bump since (nil when unknown): the bump is then written in the
-- fields' one HSET instead of an HINCRBY of its own.
local function audit_entries_at(record_key, trail_key, entries, now, fields, version)
  local n = #entries
  local last
  if version and tonumber(version) then
    last = tonumber(version) + n
    local set = {}
    for i, x in ipairs(fields or {}) do
      set[i] = x
    end
    set[#set + 1], set[#set + 2] = 'version', last
    redis.call('HSET', record_key, unpack(set))
  else
    if fields and #fields > 0 then
      redis.call('HSET', record_key, unpack(fields))
    end
    last = redis.call('HINCRBY', record_key, 'version', n)
  end
  local packed = {}
  for i, e in ipairs(entries) do
    packed[i] = audit_entry(e[1], e[2], e[3], last - n + i, e[4], now)
  end
  local pushed = redis.pcall('RPUSH', trail_key, unpack(packed))
  if type(pushed) == 'table' and pushed.err then
    for i, e in ipairs(entries) do
      redis.call('XADD', trail_key, '*', 'entity', e[1], 'from', e[2], 'to', e[3],
        'version', tostring(last - n + i), 'actor', ACTOR, 'reason', e[4], 'time', fmt(now))
    end
  end
  return last
end

local function audit_at(record_key, trail_key, entity, from, to, reason, now)
  return audit_entries_at(record_key, trail_key, {{entity, from, to, reason}}, now)
end

local function audit(entity, from, to, reason, now)
  return audit_at(KEYS[1], KEYS[3], entity, from, to, reason, now)
end

local function pool_index(pool, state)
  return POOL_PREFIX .. pool .. ':' .. state
end

-- The UTC date (YYYY-MM-DD) of a server time: the day of vmpooler's daily summary
-- hashes (days-from-civil inverted, proleptic Gregorian; no os.date in Redis' Lua).
local function utc_date(t)
  local z = math.floor(t / 86400) + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400 + (m <= 2 and 1 or 0)
  return string.format('%04d-%02d-%02d', y, m, d)
end

-- One entry of vmpooler's daily summary (GET /summary): the day's hash of ``task``
-- (boot, clone, tag) gets ``field`` -> ``value``, kept as vmpooler keeps them (no TTL).
local function count_daily(task, field, value, now)
  metric_hset(SUMMARY_PREFIX .. task .. ':' .. utc_date(now), field, value)
end

-- A clone (reserved -> booting) and a boot (booting -> ready or running) are counted
-- in the day's summary with the seconds since the VM was reserved, as vmpooler's
-- `vmpooler__clone__<date>` / `vmpooler__boot__<date>` ("POOL:VM" -> seconds).
local function count_vm_move(vm, from, to, now)
  if not vm.reserved_at then
    return
  end
  local task = nil
  if from == 'reserved' and to == 'pending' then
    task = 'clone'
  elseif from == 'pending' and (to == 'ready' or to == 'running') then
    task = 'boot'
  end
  if task then
    local seconds = math.max(0, now - tonumber(vm.reserved_at))
    count_daily(task, vm.pool .. ':' .. vm.name, string.format('%.2f', seconds), now)
  end
end

-- The template a new VM of ``pool`` is made from: the one set at runtime (POST
-- /config/pooltemplate), else the configured one the caller passed; read in the
-- reservation's own unit, so an override applies from the next VM reserved.
local function pool_template(pool, configured)
  return redis.call('HGET', TEMPLATE_OVERRIDES, pool) or configured
end

-- A VM made at its provider (reserved -> booting) or destroyed there counts in its
-- pool's totals (METRIC_VMS: the dashboard's rates), and a create that went through
-- ends its pool's run of failed creates and their back-off (POOL_FAILURES_PREFIX ..
-- pool: vmpool/state/pool_failures.py), in the unit of the transition.
local function count_made(vm, from, to)
  if from == 'reserved' and to == 'pending' then
    redis.call('HINCRBY', METRIC_VMS, 'created:' .. vm.pool, 1)
    redis.call('HDEL', POOL_FAILURES_PREFIX .. vm.pool, 'consecutive', 'rounds', 'retry_at')
  elseif to == 'destroyed' then
    redis.call('HINCRBY', METRIC_VMS, 'destroyed:' .. vm.pool, 1)
  end
end

-- A VM reserved wakes the pending sweep if the scheduler parked it (nothing was reserved
-- or booting): the parked mark (SWEEP_PARKED, rendered in: its earliest next due time)
-- goes to the list the schedulers block on (SWEEP_WAKE; workers/schedule.py). In the
-- unit of the reservation, so none is missed; one GETDEL when the sweep is not parked.
local function wake_pending_sweep()
  local earliest = redis.call('GETDEL', SWEEP_PARKED)
  if earliest then
    redis.call('RPUSH', SWEEP_WAKE, earliest)
  end
end

-- Moves a VM along one edge of VM_EDGES and keeps its pool index in step (and the
-- daily summary: count_vm_move; the pool's totals: count_made; its user's quota count:
-- quota_move; a reservation wakes the pending sweep: wake_pending_sweep).
-- ``fields``: more field, value pairs of the VM's hash the move writes (nil for none),
-- in the one HSET of its state.
-- Returns false (and changes nothing) when the edge does not exist.
local function move_vm(vm_key, vm, to, now, score, reason, fields)
  local from = vm.state
  if not VM_EDGES[from] or not VM_EDGES[from][to] then
    return false
  end
  if from ~= 'none' then
    redis.call('ZREM', pool_index(vm.pool, from), vm.name)
  end
  if to ~= 'destroyed' then
    redis.call('ZADD', pool_index(vm.pool, to), score, vm.name)
  end
  local set = {'state', to, 'state_since', fmt(now)}
  if reason ~= '' then
    set[5], set[6] = 'reason', reason
  end
  for _, x in ipairs(fields or {}) do
    set[#set + 1] = x
  end
  redis.call('HSET', vm_key, unpack(set))
  count_vm_move(vm, from, to, now)
  count_made(vm, from, to)
  quota_move(vm, from, to)
  if to == 'reserved' then
    wake_pending_sweep()
  end
  vm.state = to
  return true
end

-- A create or a boot failed: the VM goes to destruction (completed), or, booted and
-- with ``hold_s`` > 0, on hold until then for debugging (its index scored by the hold's
-- end, so the destroy sweep finds it when the hold is over). Returns the state reached.
local function fail_vm(vm, now, reason, hold_s)
  local to, score = 'completed', now
  local fields = {'error', reason}
  if vm.state == 'pending' and hold_s and hold_s > 0 then
    to, score = 'on_hold', now + hold_s
    fields[3], fields[4] = 'hold_until', fmt(score)
  end
  move_vm(KEYS[7], vm, to, now, score, reason, fields)
  return to
end

-- One observation of the ready-time histogram of a pool (observe_hist), and of the
-- line's running average of the pool's ready time.
local function observe_ready_time(pool, seconds)
  observe_hist(METRIC_READY_PREFIX .. pool, seconds)
  line_average('ready:' .. pool, seconds)  -- the ETA's time from reservation to ready
end

-- Moves the request's status along one edge of REQUEST_EDGES, with its audit entry
-- (after ``before``'s, an entry of the same unit: {entity, from, to, reason}, or nil).
-- Returns the new version, or false when the edge does not exist.
-- A request finishes when it leaves pending (to ready, failed or deleted): counted
-- here, once, whichever script moves it; a ready request deleted later is not counted
-- again, so the outcomes add up to the requests finished.
-- ``known``: {fields, version} as audit_entries_at's (more fields of the request
-- written with its status; its version as read in this unit with no bump since), or nil.
local function set_status(req, to, reason, now, before, known)
  local from = req.status
  if not REQUEST_EDGES[from] or not REQUEST_EDGES[from][to] then
    return false
  end
  local set = {'status', to, 'status_since', fmt(now)}
  for _, x in ipairs((known and known.fields) or {}) do
    set[#set + 1] = x
  end
  req.status = to
  if from == 'pending' then
    metric_hincrby(METRIC_FINISHED, to, 1)
  end
  local entries = {{'request', from, to, reason}}
  if before then
    entries = {before, entries[1]}
  end
  return audit_entries_at(KEYS[1], KEYS[3], entries, now, set, known and known.version)
end

-- Sends every live VM of the request to destruction (state completed).
local function release_vms(reason, now)
  local released = 0
  for _, name in ipairs(redis.call('SMEMBERS', KEYS[2])) do
    local vm_key = VM_PREFIX .. name
    local vm = load_hash(vm_key)
    if vm and (vm.state == 'reserved' or vm.state == 'pending' or vm.state == 'running') then
      local from = vm.state
      move_vm(vm_key, vm, 'completed', now, now, reason)
      audit('vm:' .. name, from, 'completed', reason, now)
      released = released + 1
    end
  end
  return released
end

-- The request left the open set: drop it from the indexes and give its keys a TTL so
-- Redis does not grow with history. The tombstone outlives any job that may still
-- name the request (data_ttl, hours), so no late writer can find the key missing.
-- ``served``: the request has all its VMs (fulfil: `have` >= `need`, so `unreserved`
-- is 0). It left the provision queue and the slot line in the unit that reserved or
-- claimed its last VM (reserve_vm, claim_for_request) and joined neither since: only a
-- unit that raises `unreserved` puts it back in the queue (vm_failed, end_vm_lifetime),
-- and only one that finds `unreserved` above 0 puts it in the slot line (reserve_vm's
-- refusal, clone_semaphore.lua's join). So they are not written again.
-- ``alive``: the name of a VM of the request this unit attached (running), or nil: only
-- a destroyed VM has a TTL (keep_tombstone), so its TTL is not looked at.
-- ``req``: the request's hash as read in this unit (quota_forget's).
local function close_request(req, ttl_s, served, alive)
  redis.call('ZREM', KEYS[5], RID)
  if not served then
    redis.call('ZREM', KEYS[6], RID)
  end
  quota_forget(RID, req, served)
  local ms = math.floor(ttl_s * 1000)
  for i = 1, 4 do
    redis.call('PEXPIRE', KEYS[i], ms)
  end
  -- VM tombstones already set must outlive the trail that names them (keep_tombstone);
  -- a VM with no TTL is not destroyed yet and gets its TTL from keep_tombstone later.
  for _, name in ipairs(redis.call('SMEMBERS', KEYS[2])) do
    local vm_key = VM_PREFIX .. name
    local left = -1
    if name ~= alive then
      left = redis.call('PTTL', vm_key)
    end
    if left >= 0 and left < ms then
      redis.call('PEXPIRE', vm_key, ms)
      redis.call('PEXPIRE', vm_key .. ':fence', ms)  -- Keys.vm_fence
    end
  end
end

-- ``before``, ``known``: as set_status's (the entry of the VM whose move fulfils it;
-- the request's fields written with it), or nil. ``alive``: as close_request's.
local function fulfil(req, now, before, known, alive)
  local v = set_status(req, 'ready', 'all VMs ready', now, before, known)
  observe_request_ready(req, now)
  -- a ready request must outlive its VMs' lifetime before it becomes a tombstone
  close_request(req, tonumber(req.data_ttl) + tonumber(req.lifetime), true, alive)
  return v
end

local function fail_request(req, reason, now)
  local v = set_status(req, 'failed', reason, now)
  redis.call('HSET', KEYS[1], 'failure_reason', reason)
  release_vms('request failed', now)
  close_request(req, tonumber(req.data_ttl))
  return tonumber(redis.call('HGET', KEYS[1], 'version')) or v
end

-- Expiry checks readiness inside the same unit: a request whose VMs are all attached
-- is fulfilled, never failed. A failure says the last real cause when there was one
-- (the request's last_error: a VM's failure, a quota answer its VMs waited on).
local function expire_or_fulfil(req, now)
  if tonumber(req.have) >= tonumber(req.need) then
    return 'fulfilled', fulfil(req, now)
  end
  local reason = 'The request failed to provision instances within the configured'
    .. ' ondemand_request_ttl'
  if req.last_error and req.last_error ~= '' then
    reason = reason .. '; last cause: ' .. req.last_error
  end
  return 'failed', fail_request(req, reason, now)
end


-- The cloud's address of a VM that turned ready: kept on the record (`address`) and in
-- the fleet's address index (hash ``index``: address -> VM name), so that
-- /vm/<address> finds the VM whose hostname is that address. '' records nothing.
local function record_address(vm_key, name, address, index)
  if not address or address == '' or not index or index == '' then
    return
  end
  redis.call('HSET', vm_key, 'address', address)
  redis.call('HSET', index, address, name)
end

-- A destroyed VM leaves the address index, unless its address went to another VM since.
local function forget_address(vm, index)
  if not vm.address or vm.address == '' or not index or index == '' then
    return
  end
  if redis.call('HGET', index, vm.address) == vm.name then
    redis.call('HDEL', index, vm.address)
  end
end
