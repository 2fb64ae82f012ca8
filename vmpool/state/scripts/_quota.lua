-- _quota.lua: the users' quotas and the line's pace, counted in the units of the
-- transitions that change them. The store prepends it to every store script, after the
-- rendered keys (vmpool/state/quotas.py lua_quota_keys: QUOTA_VMS, QUOTA_CORES,
-- QUOTA_PEAK, QUOTA_PARKED, QUOTA_PARKED_LINE, QUOTA_PARKED_USERS, LINE_STATS, SLOT_LINE,
-- METRIC_REQUEST_READY_PREFIX, METRIC_ETA_ERROR, METRIC_QUOTA_WAITS) and the metric
-- block (READY_BOUNDS, READY_FIELDS, READY_OVERFLOW, READY_SUM), before _prelude.lua,
-- whose move_vm and fulfil call it.
--
-- A user's count (QUOTA_VMS, QUOTA_CORES: user -> VMs, cores) is every VM whose record
-- names the user (`quota_user`: the user of the request that reserved or claimed it,
-- or the checkout's owner) while it is reserved, booting or running: the VMs the user
-- holds or has in the making. move_vm adds and takes away in the unit of each move, so
-- the count is exact whatever number of processes reserve and free VMs at once. A
-- warm-pool VM counts for nobody until a checkout or a claim gives it a user. The
-- anonymous user ('') is never counted.
--
-- A request over its user's quota waits "parked" (QUOTA_PARKED, QUOTA_PARKED_LINE,
-- QUOTA_PARKED_USERS): still pending and in the provision queue (its place in line is
-- kept), but the provision sweep passes it by. The unit that frees one of the user's
-- VMs unparks every parked request of the user: the next sweep offers them the room
-- again, oldest first. Park (quota_park.lua) re-checks the quota in its own unit, so
-- no room freed between a refusal and its park is missed.
--
-- Invariants: a user's count equals the VMs naming the user in a counted state (the
-- audit compares them); a user's peak is the most they held at once, as counted.

local QUOTA_COUNTED = {reserved = true, pending = true, running = true}
local LINE_ALPHA = 0.2  -- weight of a new sample in the line's running averages
local QUOTA_CHUNK = 500

local function q_fmt(x)
  return string.format('%.6f', x)
end

-- The metric writes of a unit (histograms, running averages, daily summaries, the
-- finished count), each made at once here. A batch script gathers them instead and
-- makes them once at its end, in its unit (vm_ready_batch.lua: metrics_gathered), so
-- these four are the one way a helper reads or writes a metric hash.
local function metric_hget(key, field)
  return redis.call('HGET', key, field)
end

local function metric_hset(key, field, value)
  redis.call('HSET', key, field, value)
end

local function metric_hincrby(key, field, n)
  redis.call('HINCRBY', key, field, n)
end

local function metric_hincrbyfloat(key, field, x)
  redis.call('HINCRBYFLOAT', key, field, q_fmt(x))
end

-- A request's place in the provision queue (KEYS[6]): its arrival less its priority's
-- lead (create_request.lua), its arrival for a request made before priorities.
local function line_score(req)
  return req.line_at or req.created
end

-- The VMs and cores ``user`` holds now.
local function quota_held(user)
  local vms = tonumber(redis.call('HGET', QUOTA_VMS, user) or '0') or 0
  local cores = tonumber(redis.call('HGET', QUOTA_CORES, user) or '0') or 0
  return vms, cores
end

-- Which quota ``user`` would pass holding ``vms`` more VMs of ``cores`` more cores:
-- 'max_vms', 'max_cores', or '' when both fit. ``max_vms``, ``max_cores``: the
-- caller's limits as strings, '' for none.
local function quota_over(user, vms, cores, max_vms, max_cores)
  if user == nil or user == '' then
    return ''
  end
  local held_vms, held_cores = quota_held(user)
  local mv, mc = tonumber(max_vms), tonumber(max_cores)
  if mv and held_vms + vms > mv then
    return 'max_vms'
  end
  if mc and held_cores + cores > mc then
    return 'max_cores'
  end
  return ''
end

-- The cores of the VMs a request still needs: for each slot, its missing VMs times the
-- cores of one VM of its pool (``per_pool``: "pool=cores,..." from the caller; 1 for a
-- pool not named).
local function quota_missing_cores(req, per_pool)
  local of = {}
  for pool, n in string.gmatch(per_pool or '', '([^=,]+)=(%d+)') do
    of[pool] = tonumber(n)
  end
  local total = 0
  for alias, pool in string.gmatch(req.requested, '([^:,]+):([^:,]+):%d+') do
    local slot = alias .. ':' .. pool
    local missing = tonumber(req['want:' .. slot]) - tonumber(req['live:' .. slot] or '0')
    if missing > 0 then
      total = total + missing * (of[pool] or 1)
    end
  end
  return total
end

local function q_each_chunk(list, fn)
  for i = 1, #list, QUOTA_CHUNK do
    fn(unpack(list, i, math.min(#list, i + QUOTA_CHUNK - 1)))
  end
end

-- A request no longer waits for a clone slot (it has its VMs, is parked, or left pending):
-- out of the clone semaphore's line (_slots.lua, slot_acquire_in_line).
local function slot_line_leave(rid)
  redis.call('ZREM', SLOT_LINE, rid)
end

-- Every parked request of ``user`` back within the provision sweep's reach.
local function quota_unpark(user)
  local lo, hi = '[' .. user .. ':', '(' .. user .. ';'  -- ';' follows ':'
  local members = redis.call('ZRANGEBYLEX', QUOTA_PARKED_USERS, lo, hi)
  if #members == 0 then
    return
  end
  redis.call('ZREMRANGEBYLEX', QUOTA_PARKED_USERS, lo, hi)
  local ids = {}
  for i, member in ipairs(members) do
    ids[i] = string.sub(member, #user + 2)
  end
  q_each_chunk(ids, function(...) redis.call('HDEL', QUOTA_PARKED, ...) end)
  q_each_chunk(ids, function(...) redis.call('ZREM', QUOTA_PARKED_LINE, ...) end)
end

-- A request waits for its user's quota, at its place in line ``line_at`` (not for a
-- clone slot meanwhile).
local function quota_park(rid, user, line_at)
  slot_line_leave(rid)
  redis.call('HSET', QUOTA_PARKED, rid, user)
  redis.call('ZADD', QUOTA_PARKED_LINE, line_at, rid)
  redis.call('ZADD', QUOTA_PARKED_USERS, 0, user .. ':' .. rid)
end

-- A request that leaves pending is parked no more, nor waits for a clone slot.
-- ``req``: its hash as read in this unit. One never parked is not looked up in the
-- parked hash: quota_park.lua stamps `quota_waited` on it in the unit that first
-- parks it, and nothing takes the stamp away. ``served``: it is out of the slot line
-- already (close_request's).
local function quota_forget(rid, req, served)
  if not served then
    slot_line_leave(rid)
  end
  if not req.quota_waited then
    return
  end
  local user = redis.call('HGET', QUOTA_PARKED, rid)
  if not user then
    return
  end
  redis.call('HDEL', QUOTA_PARKED, rid)
  redis.call('ZREM', QUOTA_PARKED_LINE, rid)
  redis.call('ZREM', QUOTA_PARKED_USERS, user .. ':' .. rid)
end

local function quota_raise_peak(user, field, value)
  local key = field .. ':' .. user
  if value > (tonumber(redis.call('HGET', QUOTA_PEAK, key) or '0') or 0) then
    redis.call('HSET', QUOTA_PEAK, key, value)
  end
end

-- A VM moves from ``from`` to ``to``: its user's count follows (move_vm calls this).
local function quota_move(vm, from, to)
  local user = vm.quota_user
  if user == nil or user == '' then
    return
  end
  local was, is = QUOTA_COUNTED[from] == true, QUOTA_COUNTED[to] == true
  if was == is then
    return
  end
  local cores = tonumber(vm.cores or '') or 1
  if is then
    quota_raise_peak(user, 'vms', redis.call('HINCRBY', QUOTA_VMS, user, 1))
    quota_raise_peak(user, 'cores', redis.call('HINCRBY', QUOTA_CORES, user, cores))
    return
  end
  if redis.call('HINCRBY', QUOTA_VMS, user, -1) <= 0 then
    redis.call('HDEL', QUOTA_VMS, user)
  end
  if redis.call('HINCRBY', QUOTA_CORES, user, -cores) <= 0 then
    redis.call('HDEL', QUOTA_CORES, user)
  end
  quota_unpark(user)
end

-- One observation of a histogram hash (the bucket of the smallest bound at or above it;
-- buckets are not cumulative here: the scrape adds them up).
local function observe_hist(key, seconds)
  local field = READY_OVERFLOW
  for i, bound in ipairs(READY_BOUNDS) do
    if seconds <= bound then
      field = READY_FIELDS[i]
      break
    end
  end
  metric_hincrby(key, field, 1)
  metric_hincrbyfloat(key, READY_SUM, seconds)
end

-- A running average of the line's pace (LINE_STATS ``field``) takes ``sample``.
-- ``known``: the field's value when the caller read it in this unit ('' for none), so
-- it is not read again; nil to read it here.
-- line_average's new value (formatted), not written.
local function line_averaged(sample, known)
  local old = tonumber(known)
  local value = sample
  if old then
    value = old + LINE_ALPHA * (sample - old)
  end
  return q_fmt(value)
end

local function line_average(field, sample, known)
  if known == nil then
    known = metric_hget(LINE_STATS, field) or ''
  end
  metric_hset(LINE_STATS, field, line_averaged(sample, known))
end

-- The request (hash ``req_key``) starts being served: its first VM reserved or claimed.
-- The time since the previous start is a sample of the line's service interval when
-- requests waited then (a backlog), so an idle fleet does not count its idle time.
-- ``first``: whether the request had not started, when the caller read it in this unit
-- and writes its `started` itself (nil: the request's `started` is set here if absent).
local function line_started(req_key, queue_key, now, first)
  if first == nil then
    first = redis.call('HSETNX', req_key, 'started', q_fmt(now)) == 1
  end
  if not first then
    return
  end
  local last = redis.call('HMGET', LINE_STATS, 'last_start', 'last_backlog', 'interval')
  local at, backlog = tonumber(last[1] or ''), tonumber(last[2] or '0') or 0
  local waiting = redis.call('ZCARD', queue_key) - redis.call('ZCARD', QUOTA_PARKED_LINE)
  local set = {'last_start', q_fmt(now), 'last_backlog', math.max(0, waiting)}
  if at and backlog > 0 then
    set[5] = 'interval'
    set[6] = line_averaged(math.min(math.max(0, now - at), 3600), last[3] or '')
  end
  redis.call('HSET', LINE_STATS, unpack(set))
end

-- A request turned ready: its time from POST by where its VMs came from (all from warm
-- pools, or some cloned), and how far its ETA at creation was off.
local function observe_request_ready(req, now)
  local source = 'fresh'
  if (tonumber(req.claimed or '0') or 0) >= tonumber(req.need) then
    source = 'warm'
  end
  observe_hist(METRIC_REQUEST_READY_PREFIX .. source, math.max(0, now - tonumber(req.created)))
  local eta_at = tonumber(req.eta_at or '')
  if eta_at then
    observe_hist(METRIC_ETA_ERROR, math.abs(now - eta_at))
  end
end
