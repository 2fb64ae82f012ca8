-- token_revoke.lua: delete an API token: any token (an admin: `vmpool token revoke`),
-- or only one of the given user's (DELETE /token/<token>).
--
-- KEYS[1]  the token's hash (P:token:<sha256>)
-- ARGV[1]  the user who asks, '' for an admin (any owner)
-- Returns  1 if the token was deleted, 0 if it is missing or someone else's.
--
-- Invariant: a user can revoke only their own tokens; the owner check and the delete
-- are one unit, so no other writer can slip between them. A script, so that the revoke
-- is confirmed as every acknowledged write is (vmpool/state/durability.py) and is
-- answered once per operation id (_once.lua): a revoke is never undone by a failover
-- it was acknowledged before, nor answered "no such token" because its retry found its
-- own work done.
local owner = redis.call('HGET', KEYS[1], 'user')
if owner and (ARGV[1] == '' or owner == ARGV[1]) then
  return redis.call('DEL', KEYS[1])
end
return 0
