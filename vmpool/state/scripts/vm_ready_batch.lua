-- vm_ready_batch.lua: vm_ready.lua for many booted VMs of requests, in one unit (a batch
-- job's claim, or the VMs one pending sweep found up): one call, one server TIME and one
-- operation id for all of them, where one call each would pay its own.
-- The store composes vm_ready.lua's body ahead of this one as the function vm_ready_one
-- (vmpool/state/store_scripts.py), which reads KEYS 1-8, RID and ARGV 5-9 as ever: each
-- VM's are put in those places before its turn.
-- KEYS: 8 per VM, VM i's at 8i-7 .. 8i, each group laid out as vm_ready.lua's KEYS 1-8
--   (its request's six, its hash and its fence: Keys.vm_script_keys).
-- ARGV: 1-3 as in _prelude.lua; 4 '' (each VM names its request below); then 6 per VM,
--   VM i's at 6i-1 .. 6i+4: its request id, then vm_ready.lua's ARGV 5-9 (the VM's name,
--   the fencing token of its lock, the hostname, the cloud's address, the address
--   index).
-- Returns: {changed, reply_1, ..., reply_n}: reply_i is vm_ready.lua's reply for VM i
--   ({1, code, version} or {0, refusal}); changed: how many of them changed something
--   (0: the unit changed nothing, and _once.lua records nothing).
-- Invariant: each VM is checked and moved exactly as vm_ready.lua would, in the order
-- given, each with its own precondition (record, request, fencing token, state): a
-- refusal of one changes nothing of it and does not stop the others. The one TIME is
-- the unit's: the VMs turn ready at the same server instant, as they do in one atomic
-- unit. The metric writes (_quota.lua's metric_*) are gathered and made once each at
-- the end of the unit (metrics_made), so what they count is counted in the unit of
-- the transitions it counts, as in vm_ready.lua, and the same: increments summed (a
-- float's each rounded as its own write rounds it), a field set last wins, a running
-- average reads what the unit gathered. A repeat of the call (same operation id)
-- answers the first reply and changes nothing.

-- The unit's metric writes, by kind ('set', 'int', 'float'), hash and field, in the
-- order first made.
local gathered, gathered_order = {set = {}, int = {}, float = {}}, {}

local function gather(kind, key, field)
  local fields = gathered[kind][key]
  if not fields then
    fields = {}
    gathered[kind][key] = fields
  end
  local entry = fields[field]
  if not entry then
    entry = {kind = kind, key = key, field = field}
    fields[field] = entry
    gathered_order[#gathered_order + 1] = entry
  end
  return entry
end

metric_hget = function(key, field)
  local fields = gathered.set[key]
  if fields and fields[field] then
    return fields[field].value
  end
  return redis.call('HGET', key, field)
end

metric_hset = function(key, field, value)
  gather('set', key, field).value = value
end

metric_hincrby = function(key, field, n)
  local entry = gather('int', key, field)
  entry.value = (entry.value or 0) + n
end

metric_hincrbyfloat = function(key, field, x)
  local entry = gather('float', key, field)
  entry.value = (entry.value or 0) + tonumber(q_fmt(x))
end

-- The gathered writes made: one HINCRBY or HINCRBYFLOAT per field, one HSET per hash.
local function metrics_made()
  local sets, set_keys = {}, {}
  for _, e in ipairs(gathered_order) do
    if e.kind == 'int' then
      redis.call('HINCRBY', e.key, e.field, e.value)
    elseif e.kind == 'float' then
      redis.call('HINCRBYFLOAT', e.key, e.field, q_fmt(e.value))
    else
      if not sets[e.key] then
        sets[e.key] = {}
        set_keys[#set_keys + 1] = e.key
      end
      local pairs_of = sets[e.key]
      pairs_of[#pairs_of + 1], pairs_of[#pairs_of + 2] = e.field, e.value
    end
  end
  for _, key in ipairs(set_keys) do
    redis.call('HSET', key, unpack(sets[key]))
  end
end

local group_keys, group_args = {}, {}
for i, key in ipairs(KEYS) do
  group_keys[i] = key
end
for i = 5, #ARGV do
  group_args[i - 4] = ARGV[i]
end
local now = server_now()
server_now = function()
  return now
end
local out = {0}
for i = 1, #group_keys / 8 do
  for j = 1, 8 do
    KEYS[j] = group_keys[8 * (i - 1) + j]
  end
  local at = 6 * (i - 1)
  RID = group_args[at + 1]
  for j = 1, 5 do
    ARGV[4 + j] = group_args[at + 1 + j]
  end
  local reply = vm_ready_one()
  if reply[1] == 1 then
    out[1] = out[1] + 1
  end
  out[i + 1] = reply
end
metrics_made()
return out
