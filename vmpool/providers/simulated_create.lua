-- simulated_create.lua: write one simulated VM unless it already exists.
-- KEYS[1]  the VM hash (keys.sim_vm(provider, name))
-- KEYS[2]  the provider's inventory set (keys.sim_inventory(provider))
-- ARGV     name, pool, template, boot_seconds (decimal string), never_ready ("0"|"1")
-- returns  {created (1 new | 0 existed), server time "%.6f", HGETALL of the VM hash...}
-- invariant: the name is in KEYS[2] iff KEYS[1] exists; both change here together, so
--   two racing creates of one name make exactly one VM and the loser gets the winner's.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local now_s = string.format('%.6f', now)
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, now_s, redis.call('HGETALL', KEYS[1])}
end
redis.call('HSET', KEYS[1],
  'name', ARGV[1], 'pool', ARGV[2], 'template', ARGV[3], 'state', 'booting',
  'created_at', now_s,
  'ready_at', string.format('%.6f', now + tonumber(ARGV[4])),
  'never_ready', ARGV[5], 'destroy_attempts', '0')
redis.call('SADD', KEYS[2], ARGV[1])
return {1, now_s, redis.call('HGETALL', KEYS[1])}
