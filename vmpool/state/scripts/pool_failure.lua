-- pool_failure.lua: a failure the dashboard lists, and a failed create's toll on its pool.
-- Not a store script: vmpool/state/pool_failures.py loads it alone (no transition tables).
-- KEYS[1]  the fleet's latest failures (keys.recent_failures): a list, newest first
-- KEYS[2]  the pool's create failures (keys.pool_failures): consecutive (failed creates
--          since the last that went through), rounds (back-off rounds of the streak),
--          last_error, last_error_at and retry_at (server time)
-- ARGV[1]  what failed: 'create' (counts toward the pool's streak), 'boot' or 'request'
-- ARGV[2]  '1' when retrying cannot help (a create's permanent error: the pool backs off)
-- ARGV[3]  the first back-off, seconds;  ARGV[4]  the longest, seconds
-- ARGV[5]  how many failures the list keeps
-- ARGV[6]  the failure as JSON (pool, vm, request_id, reason); the time is added here
-- Returns: {consecutive, retry_at ('' when the pool does not back off)}; {0, ''} when
--          the failure is not a create.
-- Invariant: one round of back-off per run of failures, however many creates fail
-- together: a failure while the pool already backs off leaves its retry time alone, so
-- the delay doubles once per round (first * 2^(rounds-1), at most the longest) and the
-- pool is never held back longer than the longest back-off from its last round.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local entry = cjson.decode(ARGV[6])
entry['time'] = now
entry['kind'] = ARGV[1]
redis.call('LPUSH', KEYS[1], cjson.encode(entry))
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[5]) - 1)
if ARGV[1] ~= 'create' then
  return {0, ''}
end
local consecutive = redis.call('HINCRBY', KEYS[2], 'consecutive', 1)
redis.call('HSET', KEYS[2], 'last_error', entry['reason'], 'last_error_at',
  string.format('%.6f', now))
if ARGV[2] ~= '1' then
  return {consecutive, ''}
end
local retry_at = tonumber(redis.call('HGET', KEYS[2], 'retry_at') or '0')
if retry_at <= now then
  local rounds = redis.call('HINCRBY', KEYS[2], 'rounds', 1)
  local delay = math.min(tonumber(ARGV[4]), tonumber(ARGV[3]) * 2 ^ (rounds - 1))
  retry_at = now + delay
  redis.call('HSET', KEYS[2], 'retry_at', string.format('%.6f', retry_at))
end
return {consecutive, string.format('%.6f', retry_at)}
