-- token_touch.lua: record when an API token was last used, only if it still exists.
--
-- KEYS[1]  the token's hash (P:token:<sha256>)
-- ARGV[1]  the time of use (text, as the API writes it)
-- Returns  1 if the token existed and was touched, 0 otherwise.
--
-- Invariant: a revoked token stays revoked. A plain HSET racing with a revoke would
-- recreate the hash (with `last` only); the EXISTS check inside the script cannot race.
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'last', ARGV[1])
  return 1
end
return 0
