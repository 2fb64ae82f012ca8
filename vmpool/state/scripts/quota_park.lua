-- quota_park.lua: a pending request over its user's quota waits, parked, for the
-- user's VMs to be freed (no transition: it stays pending and keeps its place in line).
-- KEYS: 1-6 as in _prelude.lua.
-- ARGV: 1-4 as in _prelude.lua; 5 the user's max_vms, 6 max_cores ('' for no limit);
--   7 the cores of one VM of each pool ("pool=n,...") (vmpool/state/quotas.py).
-- Returns: {1, 'parked', -1} or {0, 'no_request' | 'request_<status>' | 'no_user' |
--   'nothing_to_reserve' | 'quota_free'}.
-- Invariant: no wake-up is lost. The quota is checked again in this unit, so a VM of the
-- user freed since the caller's refusal finds the request not parked ('quota_free': the
-- caller tries again), and one freed later unparks it (_quota.lua: quota_move). Each
-- request counts once in its user's quota waits (METRIC_QUOTA_WAITS), the first time it
-- is parked; its `last_error` says what it waits for (its failure by TTL reports it).
local req = load_hash(KEYS[1])
if not req then
  return refuse('no_request')
end
if req.status ~= 'pending' then
  return refuse('request_' .. req.status)
end
local user = req.token_user or ''
if user == '' then
  return refuse('no_user')
end
local unreserved = tonumber(req.unreserved)
if unreserved <= 0 then
  return refuse('nothing_to_reserve')
end
local over = quota_over(user, unreserved, quota_missing_cores(req, ARGV[7]), ARGV[5], ARGV[6])
if over == '' then
  return refuse('quota_free')
end
quota_park(RID, user, line_score(req))
local limit = over == 'max_vms' and ARGV[5] or ARGV[6]
redis.call('HSET', KEYS[1], 'last_error', 'waiting for user ' .. user .. "'s quota (" .. over
  .. ' ' .. limit .. ')')
if redis.call('HSETNX', KEYS[1], 'quota_waited', fmt(server_now())) == 1 then
  redis.call('HINCRBY', METRIC_QUOTA_WAITS, user, 1)
end
return {1, 'parked', -1}
