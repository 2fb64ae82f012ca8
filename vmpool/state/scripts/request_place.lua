-- request_place.lua: where a pending request stands in the line of service, for GET
-- /ondemandvm/<id> and `vmpool request show`: its position and its ETA (_line.lua).
-- Reads only. Not a store script (no transition): vmpool/state/quotas.py loads it after
-- the rendered keys (counters.lua_quota_keys) and _line.lua.
-- KEYS[1]  the request's hash          KEYS[2]  the provision queue (Keys.provision_queue)
-- ARGV[1]  the request id              ARGV[2]  the prefix of the pool indexes
-- ARGV[3]  the fleet's clone limit (0: unknown)
-- Returns: {position, eta} (eta: seconds as a string, '' while the request waits for its
--   user's quota) or {} when the request is not pending.
-- Invariant: one snapshot; the request's record, the queue and the line's figures are
-- read in one unit, so a position is never computed from a queue the request has left.
local flat = redis.call('HGETALL', KEYS[1])
local req = {}
for i = 1, #flat, 2 do
  req[flat[i]] = flat[i + 1]
end
if req.status ~= 'pending' then
  return {}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local position, eta = line_place(req, ARGV[1], now, KEYS[2], ARGV[2], tonumber(ARGV[3]) or 0)
return {position, eta and string.format('%.3f', eta) or ''}
