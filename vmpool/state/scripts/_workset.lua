-- _workset.lua: the work-set functions, shared by work_add.lua, work_claim.lua,
-- work_done.lua, create_request.lua and workers/lanes_probe.lua (each gets this text,
-- after WORK_PARTS rendered from vmpool/state/keys.py, by vmpool.state.workset.lua_workset).
--
-- A work set (vmpool/state/workset.py) of base key B (keys.work_set(job)) is:
--   B            zset  every subject waiting or claimed -> its arrival (server time, s):
--                      the dedup (a subject is in it once) and its place in line
--   B:queue:O    zset  the waiting subjects of owner O ('' for no user) -> arrival
--   B:turns      zset  the owners with a subject waiting -> their turn
--   B:served     hash  owner -> when it was last served
--   B:owner      hash  subject -> its owner (only when not '')
--   B:claims     zset  claimed or deferred subjects -> when their lease ends
--   B:claimed    hash  claimed subject -> the id of the claim that holds it
--
-- Order of service (docs/invariants.md, invariant 10; docs/state-machine.md "Order of
-- service"): a claim takes the owner with the smallest turn, and that owner's oldest
-- waiting subject; the owner's turn becomes the time of service (the back of the
-- line). A subject that starts waiting gives its owner the turn max(its arrival, when
-- the owner was last served), unless the owner's turn is earlier already. So owners
-- are served round-robin, each owner's subjects oldest first, and owners that each
-- wait with one subject are served in order of arrival. Arrival is server time (a
-- request's `created`), never the subject's name.
--
-- Invariants: a subject is claimed by one claim at a time while its lease runs; a
-- claim's lease that ends (its claimer died or stalled) puts the subject back in line
-- at its arrival; a claim ends (done, release, defer, renew) only subjects it still
-- holds.
--
-- Cost: every function works on a list of subjects with a fixed number of commands per
-- call (and per owner), not per subject (what the batch jobs exist for), in
-- chunks of WS_CHUNK (unpack() has a stack limit).

local WS_CHUNK = 500

local function ws_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function ws_fmt(x)
  return string.format('%.6f', x)
end

local function ws_parts(base)
  return {
    base = base,
    claims = base .. WORK_PARTS.claims,
    claimed = base .. WORK_PARTS.claimed,
    turns = base .. WORK_PARTS.turns,
    served = base .. WORK_PARTS.served,
    owner = base .. WORK_PARTS.owner,
    queue = base .. WORK_PARTS.queue,
  }
end

-- `cmd key list[i..j]` for each chunk of `list` (a flat list: members, or pairs when
-- `step` is 2); the replies concatenated (for ZMSCORE, HMGET).
local function ws_call(cmd, key, list, step)
  local out = {}
  local size = WS_CHUNK * (step or 1)
  for i = 1, #list, size do
    local part = redis.call(cmd, key, unpack(list, i, math.min(#list, i + size - 1)))
    if type(part) == 'table' then
      for k = 1, #part do
        out[#out + 1] = part[k]
      end
    end
  end
  return out
end

-- Put `subjects` of one owner in its queue at `arrivals` (score strings, in the same
-- order). The owner's turn: at most max(its oldest arrival here, when it was last
-- served) (an owner not in line joins it; one in line keeps an earlier turn, and
-- moves up to an older subject's that is not earlier than its last service).
local function ws_enqueue(W, owner, subjects, arrivals)
  local pairs_, oldest = {}, nil
  for i, subject in ipairs(subjects) do
    pairs_[#pairs_ + 1] = arrivals[i]
    pairs_[#pairs_ + 1] = subject
    local a = tonumber(arrivals[i])
    if oldest == nil or a < oldest then
      oldest = a
    end
  end
  if oldest == nil then
    return
  end
  ws_call('ZADD', W.queue .. owner, pairs_, 2)
  local served = tonumber(redis.call('HGET', W.served, owner) or '0')
  if served > oldest then
    oldest = served
  end
  redis.call('ZADD', W.turns, 'LT', ws_fmt(oldest), owner)
end

-- Subjects (with their arrivals and owners, lists in the same order) grouped by owner
-- and queued.
local function ws_enqueue_by_owner(W, subjects, arrivals, owners)
  local groups, order = {}, {}
  for i, subject in ipairs(subjects) do
    local owner = owners[i] or ''
    if not groups[owner] then
      groups[owner] = {{}, {}}
      order[#order + 1] = owner
    end
    local g = groups[owner]
    g[1][#g[1] + 1] = subject
    g[2][#g[2] + 1] = arrivals[i]
  end
  for _, owner in ipairs(order) do
    ws_enqueue(W, owner, groups[owner][1], groups[owner][2])
  end
end

-- Add subjects (lists: subjects, arrival score strings, owners) unless already in;
-- returns how many were added. A subject in the set but neither waiting in its
-- owner's queue nor claimed was added by an older release (a set scored 0, with no
-- queues): it is put in line now, at its arrival, so a rolling upgrade loses none.
local function ws_add_many(W, subjects, arrivals, owners)
  local scores = ws_call('ZMSCORE', W.base, subjects)
  local add, add_at, add_by, owned, known = {}, {}, {}, {}, {}
  for i, subject in ipairs(subjects) do
    if scores[i] then
      known[#known + 1] = i
    else
      add[#add + 1] = subject
      add_at[#add_at + 1] = arrivals[i]
      add_by[#add_by + 1] = owners[i]
    end
  end
  if #known > 0 then  -- in the set: claimed, waiting, or left by an older release?
    local names = {}
    for k, i in ipairs(known) do
      names[k] = subjects[i]
    end
    local claimed = ws_call('ZMSCORE', W.claims, names)
    for k, i in ipairs(known) do
      local queue = W.queue .. (owners[i] or '')
      if not claimed[k] and not redis.call('ZSCORE', queue, subjects[i]) then
        add[#add + 1] = subjects[i]
        add_at[#add_at + 1] = arrivals[i]
        add_by[#add_by + 1] = owners[i]
      end
    end
  end
  if #add == 0 then
    return 0
  end
  local scored = {}
  for i, subject in ipairs(add) do
    scored[#scored + 1] = add_at[i]
    scored[#scored + 1] = subject
    if (add_by[i] or '') ~= '' then
      owned[#owned + 1] = subject
      owned[#owned + 1] = add_by[i]
    end
  end
  ws_call('ZADD', W.base, scored, 2)
  if #owned > 0 then
    ws_call('HSET', W.owner, owned, 2)
  end
  ws_enqueue_by_owner(W, add, add_at, add_by)
  return #add
end

-- One subject (create_request.lua's new request).
local function ws_add(W, subject, arrival, owner)
  return ws_add_many(W, {subject}, {arrival}, {owner})
end

-- Claimed or deferred subjects go back in line, at their arrivals.
local function ws_requeue(W, subjects)
  if #subjects == 0 then
    return
  end
  ws_call('ZREM', W.claims, subjects)
  ws_call('HDEL', W.claimed, subjects)
  local arrivals = ws_call('ZMSCORE', W.base, subjects)
  local owners = ws_call('HMGET', W.owner, subjects)
  local back, at, by = {}, {}, {}
  for i, subject in ipairs(subjects) do
    if arrivals[i] then  -- still in the set (not done meanwhile)
      back[#back + 1] = subject
      at[#at + 1] = arrivals[i]
      by[#by + 1] = owners[i] or ''
    end
  end
  ws_enqueue_by_owner(W, back, at, by)
end

-- Leases that ended by `now`: their subjects go back in line (at most `max` of them).
local function ws_requeue_lapsed(W, now, max)
  ws_requeue(W, redis.call('ZRANGEBYSCORE', W.claims, '-inf', ws_fmt(now), 'LIMIT', 0, max))
end

-- Add the subjects ARGV[first..] (work_add.lua's ARGV): with `head` '' they are VMs
-- (arrival now, no owner), else request ids, whose hash is head .. id .. tail: arrival
-- is the request's place in line (`line_at`: its priority and its user's fair share
-- are in it, _line.lua), with no owner, so requests are served in the order of their
-- places; a request made before places has its `created` and its `token_user` as owner
-- (served round-robin across users, as then). Returns how many were added.
local function ws_add_subjects(W, head, tail, first)
  local stamp = ws_fmt(ws_now())
  local subjects, arrivals, owners = {}, {}, {}
  for i = first, #ARGV do
    local arrival, owner = stamp, ''
    if head ~= '' then
      local rec = redis.call('HMGET', head .. ARGV[i] .. tail, 'created', 'token_user',
        'line_at')
      arrival = rec[3] or rec[1] or stamp
      owner = (not rec[3] and rec[2]) or ''
    end
    subjects[#subjects + 1] = ARGV[i]
    arrivals[#arrivals + 1] = arrival
    owners[#owners + 1] = owner
  end
  if #subjects == 0 then
    return 0
  end
  return ws_add_many(W, subjects, arrivals, owners)
end
