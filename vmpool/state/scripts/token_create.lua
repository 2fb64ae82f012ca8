-- token_create.lua: store a new API token and keep its user's list of tokens bounded.
--
-- KEYS[1]  the new token's hash (P:token:<sha256>)
-- KEYS[2]  the user's token index (P:user-tokens:<sha256 of the user>), zset sha -> created
-- ARGV[1]  the user
-- ARGV[2]  the time of creation (seconds, text, the server's clock)
-- ARGV[3]  the token's TTL in milliseconds, 0 for none
-- ARGV[4]  the most tokens the user may hold (>= 1)
-- ARGV[5]  the token hash prefix (P:token:), to reach the user's other tokens
-- ARGV[6]  the new token's sha256
-- ARGV[7]  the expiry time (seconds, text) or '' for none
-- ARGV[8]  the token sealed for its caller's repeat (vmpool/api/idempotency.py), or ''
-- Returns  {1, the number of older tokens dropped to stay within the bound, ARGV[8]}:
--          the reply a repeat of the same operation id answers (_once.lua).
--
-- Invariant: after the script, the user holds at most ARGV[4] live tokens created through
-- it; the oldest go first. Entries whose token expired or was revoked are pruned before
-- counting, so they take no place. The index lives as long as its longest-lived token.
local ttl = tonumber(ARGV[3])
local max = tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'user', ARGV[1], 'created', ARGV[2], 'last', '', 'expires', ARGV[7])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
for _, sha in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  if redis.call('EXISTS', ARGV[5] .. sha) == 0 then
    redis.call('ZREM', KEYS[2], sha)
  end
end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[6])
local dropped = 0
while redis.call('ZCARD', KEYS[2]) > max do
  local oldest = redis.call('ZPOPMIN', KEYS[2])
  redis.call('DEL', ARGV[5] .. oldest[1])
  dropped = dropped + 1
end
if ttl > 0 then
  if redis.call('PTTL', KEYS[2]) < ttl then
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
else
  redis.call('PERSIST', KEYS[2])
end
return {1, dropped, ARGV[8]}
