-- request_place.lua: a request as GET /ondemandvm/<id> and `vmpool request show` read it:
-- its record, its VMs' names (and their hashes once it is ready) and, while it is
-- pending, where it stands in the line of service: its position and its ETA (_line.lua).
-- Reads only. Not a store script (no transition): vmpool/state/quotas.py loads it after
-- the rendered keys (counters.lua_quota_keys) and _line.lua.
-- KEYS[1]  the request's hash          KEYS[2]  the provision queue (Keys.provision_queue)
-- KEYS[3]  the request's VM set (Keys.request_vms)
-- ARGV[1]  the request id              ARGV[2]  the prefix of the pool indexes
-- ARGV[3]  the fleet's clone limit (0: unknown)
-- ARGV[4]  the prefix of the VM hashes (Keys.vm_prefix), a VM's name appended
-- Returns: {hash, vms, ready_vms, position, eta} while the request is pending, {hash,
--   vms, ready_vms} otherwise ({{}, {}, {}}: no such request). hash: its HGETALL; vms:
--   its SMEMBERS; ready_vms: once it is ready, the HGETALL of each of its VMs (in the
--   order of vms), else {}; eta: seconds as a string, '' while the request waits for its
--   user's quota.
-- Invariant: one snapshot; the request's record, its VMs, the queue and the line's
-- figures are read in one unit, so a position is never computed from a queue the request
-- has left, nor shown beside a record that is no longer pending.
local flat = redis.call('HGETALL', KEYS[1])
local vms = redis.call('SMEMBERS', KEYS[3])
local req = {}
for i = 1, #flat, 2 do
  req[flat[i]] = flat[i + 1]
end
if req.status ~= 'pending' then
  local ready = {}
  if req.status == 'ready' then
    for i, name in ipairs(vms) do
      ready[i] = redis.call('HGETALL', ARGV[4] .. name)
    end
  end
  return {flat, vms, ready}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local position, eta = line_place(req, ARGV[1], now, KEYS[2], ARGV[2], tonumber(ARGV[3]) or 0)
return {flat, vms, {}, position, eta and string.format('%.3f', eta) or ''}
