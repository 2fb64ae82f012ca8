-- token_revoke_own.lua: delete an API token only if it belongs to the given user.
--
-- KEYS[1]  the token's hash (P:token:<sha256>)
-- ARGV[1]  the user who asks
-- Returns  1 if the token was deleted, 0 if it is missing or someone else's.
--
-- Invariant: a user can revoke only their own tokens; the owner check and the delete
-- are one unit, so no other writer can slip between them.
if redis.call('HGET', KEYS[1], 'user') == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
