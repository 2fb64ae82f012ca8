-- simulated_destroy_attempt.lua: count one more attempt to destroy a VM; never
-- resurrects it.
-- KEYS[1]  the VM hash
-- ARGV     (none)
-- returns  the attempt number (1, 2, ...), or 0 when the VM does not exist
-- invariant: never creates the hash (a bare HINCRBY on a destroyed VM would).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
return redis.call('HINCRBY', KEYS[1], 'destroy_attempts', 1)
