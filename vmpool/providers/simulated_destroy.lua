-- simulated_destroy.lua: remove one simulated VM.
-- KEYS[1]  the VM hash
-- KEYS[2]  the provider's inventory set
-- ARGV[1]  the VM name
-- returns  1 if a VM was destroyed, 0 if there was none (destroying twice is fine)
-- invariant: the hash and the inventory membership go together.
local existed = redis.call('DEL', KEYS[1])
local member = redis.call('SREM', KEYS[2], ARGV[1])
if existed == 1 or member == 1 then
  return 1
end
return 0
