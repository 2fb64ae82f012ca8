-- provider_capacity.lua: may one more VM of this provider be created, within its own
-- max_instances / max_cores? Counted from the fleet's own VMs, so vmpool stops asking
-- before the cloud says no.
-- Not a store script: vmpool/state/capacity.py loads it alone (no transition tables).
-- KEYS[1]  the provider's launching zset (keys.provider_launching): 'pool|name' of each
--          VM being created now, score = when its claim lapses (server time)
-- KEYS[2..] for each pool of the provider, in ARGV's order: its pending, ready, running,
--          completed and on_hold indexes (VMs the cloud holds or is making)
-- ARGV[1]  'admit' (claim a place for ARGV[3]) | 'check' (would one more fit?)
-- ARGV[2]  how long a claim lasts unless renewed (seconds)
-- ARGV[3]  the member 'pool|name' to admit ('' for check)
-- ARGV[4]  max_instances (0: none); ARGV[5] max_cores (0: none)
-- ARGV[6..] pairs: pool name, cores of one of its VMs
-- Returns: {1, instances, cores} when it fits (admit: claimed), {0, instances, cores}
--          when it does not (nothing claimed).
-- Invariant: admissions racing each other never exceed either limit: the count of the
-- indexes and of the live claims, and the claim, are one atomic unit. A VM counts twice
-- (claim and pending index) between its vm_created and its claim's release: an
-- over-count, never an under-count.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local member = ARGV[3]
local cores_of = {}
local instances, cores = 0, 0
local pools = 0
for i = 6, #ARGV, 2 do
  local pool, c = ARGV[i], tonumber(ARGV[i + 1])
  cores_of[pool] = c
  local base = 2 + pools * 5
  local n = 0
  for k = base, base + 4 do
    n = n + redis.call('ZCARD', KEYS[k])
  end
  instances = instances + n
  cores = cores + n * c
  pools = pools + 1
end
for _, claimed in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if claimed ~= member then
    instances = instances + 1
    cores = cores + (cores_of[string.match(claimed, '^([^|]*)|')] or 1)
  end
end
local own = 1
if member ~= '' then
  own = cores_of[string.match(member, '^([^|]*)|')] or 1
else
  own = 0
  for _, c in pairs(cores_of) do
    if own == 0 or c < own then own = c end
  end
end
local max_instances, max_cores = tonumber(ARGV[4]), tonumber(ARGV[5])
if (max_instances > 0 and instances + 1 > max_instances)
    or (max_cores > 0 and cores + own > max_cores) then
  return {0, instances, cores}
end
if ARGV[1] == 'admit' then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), member)
end
return {1, instances, cores}
