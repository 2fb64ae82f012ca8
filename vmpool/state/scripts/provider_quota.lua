-- provider_quota.lua: a provider's cloud answered "quota" (or "no capacity"): its pools
-- stop creating for a while, and the VMs wait reserved instead of failing.
-- Not a store script: vmpool/state/circuit.py loads it alone (no transition tables).
-- KEYS[1]  the provider's circuit hash (keys.provider_circuit), whose quota fields are
--          quota_until (server time), quota_error (the cloud's words), quota_held (times
--          a quota answer held the provider back)
-- ARGV[1]  how long creates wait, in seconds
-- ARGV[2]  the cloud's message
-- Returns: {quota_until}
-- Invariant: a hold only ever moves later (workers reporting together set one hold, the
-- latest end wins); the breaker's own fields (failures, open_until) are not touched:
-- quota is the account's limit, not the cloud's health.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local until_ = now + tonumber(ARGV[1])
local current = tonumber(redis.call('HGET', KEYS[1], 'quota_until') or '0')
if current < until_ then
  redis.call('HSET', KEYS[1], 'quota_until', string.format('%.6f', until_))
end
if current <= now then
  redis.call('HINCRBY', KEYS[1], 'quota_held', 1)
end
redis.call('HSET', KEYS[1], 'quota_error', ARGV[2])
return {string.format('%.6f', math.max(current, until_))}
