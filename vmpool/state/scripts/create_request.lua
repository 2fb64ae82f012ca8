-- create_request.lua: a new on-demand request, its data and its queue entries at once.
-- KEYS: 1-6 as in _prelude.lua; 7 (optional) the provision work set
--   (vmpool.state.workset.WorkSet, Keys.work_set('provision_request')): when given, the
--   new request's id is added to it (its place in line: its arrival, `created`; its
--   owner: the token user), so the batch provisioning finds it without another round
--   trip; or, when others wait for a clone slot ahead of it with none free in its turn
--   and none of its pools holds a ready VM, it waits in the clone slots' line instead,
--   at its place (_slots.lua slot_line_full_for), to be dispatched in its turn as the
--   provision sweep dispatches the requests in that line. The store prepends the
--   work-set functions (_workset.lua) and the slots' (_slots.lua).
-- ARGV: 1-4 as in _prelude.lua; 5 slots "alias:pool:n,alias:pool:n" (vmpooler's
--   `requested` format); 6 ttl seconds; 7 grace seconds; 8 max_vm_retries;
--   9 VM lifetime seconds; 10 data_ttl seconds; 11 token user ('' for none);
--   12 token hash ('' for none); 13 priority (1 highest, 3 lowest; '' for 2);
--   14 the priority's lead in seconds (vmpool.config.QuotaConfig.lead_s); 15 the fleet's
--   clone limit (for its ETA and the slots' line; '' or 0: unknown, the line is never
--   joined here); 16 the round of fair share in seconds
--   (the aging period): its place in line is its arrival less the lead, and a round
--   behind its user's previous request of its priority still waiting (_line.lua).
-- Returns: {1, 'created', version} or {0, 'exists' | 'empty'}.
-- Invariant: the request's data and its index entries appear in one unit, so no worker
-- can see an id without its data (vmpooler ZADDs before it HSETs); an id that exists,
-- tombstones included, is never overwritten. Ids are never reused: while any key of an
-- earlier request of this id is left (its hash, VM set, trail or fence: each has its own
-- PEXPIRE, so one may outlive another), the id is taken; a new request sharing an old
-- trail or VM set would mix two stories and release the other's VMs.
-- The request is born pending at version 1 with its first trail entry (none -> pending,
-- an edge of REQUEST_EDGES): the one HSET writes what set_status and audit would write
-- with three more commands (fewer commands per script); the trail is new (no
-- key of the id exists), so it is a list from its first entry. Its ETA now (_line.lua)
-- is kept (`eta_at`, in the same HSET), so its error is measured when it turns ready
-- (_quota.lua).

-- Whether a pool of ``requested`` ("alias:pool:n,...") holds a ready VM it might lend.
local function pools_hold_ready(requested)
  for _, pool in string.gmatch(requested, '([^:,]+):([^:,]+):%d+') do
    if redis.call('ZCARD', POOL_PREFIX .. pool .. ':ready') > 0 then
      return true
    end
  end
  return false
end

if redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3], KEYS[4]) > 0 then
  return refuse('exists')
end
local now = server_now()
local need = 0
local fields = {}
for alias, pool, n in string.gmatch(ARGV[5], '([^:,]+):([^:,]+):(%d+)') do
  local count = tonumber(n)
  if count > 0 then
    need = need + count
    local slot = alias .. ':' .. pool
    fields['want:' .. slot] = (fields['want:' .. slot] or 0) + count
    fields['live:' .. slot] = 0
    fields['have:' .. slot] = 0
  end
end
if need == 0 then
  return refuse('empty')
end
if not REQUEST_EDGES['none']['pending'] then
  return redis.error_reply('create_request: none -> pending is not an edge of REQUEST_EDGES')
end
local priority = tonumber(ARGV[13] or '') or 2
local line_at = fmt(line_new_place(RID, ARGV[11], priority, now, tonumber(ARGV[14] or '') or 0,
  tonumber(ARGV[16] or '') or 0, KEYS[6]))
local deadline = now + tonumber(ARGV[6])
local fail_at = deadline + tonumber(ARGV[7])
local stamp = fmt(now)
local version = 1
-- In line first: its ETA (line_place) counts from its place there, and reads nothing
-- of its record, so the ETA is written in the record's one HSET.
redis.call('ZADD', KEYS[6], line_at, RID)
local placed = {requested = ARGV[5], need = need, unreserved = need, created = stamp}
local _, eta = line_place(placed, RID, now, KEYS[6], POOL_PREFIX, tonumber(ARGV[15] or '') or 0)
local record = {
  'id', RID, 'status', 'pending', 'status_since', stamp, 'version', version,
  'created', stamp, 'deadline', fmt(deadline), 'fail_at', fmt(fail_at),
  'requested', ARGV[5], 'need', need, 'have', 0, 'unreserved', need, 'retries', 0,
  'max_retries', ARGV[8], 'lifetime', ARGV[9], 'data_ttl', ARGV[10],
  'token_user', ARGV[11], 'token_hash', ARGV[12], 'created_by', ACTOR,
  'priority', priority, 'line_at', line_at}
if eta then
  fields['eta_at'] = fmt(now + eta)
end
for field, value in pairs(fields) do
  record[#record + 1] = field
  record[#record + 1] = value
end
redis.call('HSET', KEYS[1], unpack(record))
redis.call('RPUSH', KEYS[3], audit_entry('request', 'none', 'pending', version, 'created', now))
redis.call('ZADD', KEYS[5], fmt(fail_at), RID)
-- Behind a full clone line its first provision claim would only put it in the line:
-- a claim of a burst's new requests would cost their locks and reservations for that.
-- The line is read first: its pools' ready VMs are read only when it is full.
local clone_limit = tonumber(ARGV[15] or '') or 0
if KEYS[7] then
  if clone_limit > 0 and slot_line_full_for(line_at, clone_limit, now)
      and not pools_hold_ready(ARGV[5]) then
    redis.call('ZADD', SLOT_LINE, line_at, RID)  -- waits for its turn, at its place
  else
    ws_add(ws_parts(KEYS[7]), RID, line_at, '')  -- served in the order of places
  end
end
return {1, 'created', version}
