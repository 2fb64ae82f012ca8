-- expire_request.lua: the request's time (TTL + grace) is up: fulfil it if all its VMs
-- are attached, else fail it and release its VMs.
-- KEYS: 1-6 as in _prelude.lua.
-- ARGV: 1-4 as in _prelude.lua.
-- Returns: {1, 'fulfilled' | 'failed', version} or
--   {0, 'no_request' | 'request_<status>' | 'not_expired'}.
-- Invariant: expiry reads the deadline from the request's own hash, inside the unit,
-- against the server's clock: a missing index score never means "expired", a request
-- that is not pending is never touched, and a complete request is never failed.
-- Metrics: the request counts as finished (ready or failed) in this unit; a refusal
-- counts nothing.
local req = load_hash(KEYS[1])
if not req then
  redis.call('ZREM', KEYS[5], RID)
  return refuse('no_request')
end
if req.status ~= 'pending' then
  redis.call('ZREM', KEYS[5], RID)
  return refuse('request_' .. req.status)
end
local now = server_now()
if now < tonumber(req.fail_at) then
  return refuse('not_expired')
end
local outcome, v = expire_or_fulfil(req, now)
return {1, outcome, v}
