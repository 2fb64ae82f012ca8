-- provider_circuit.lua: one provider's circuit breaker, shared by every worker.
-- Not a store script: vmpool/state/circuit.py loads it alone (no transition tables).
-- KEYS[1]  the provider's circuit hash (keys.provider_circuit): failures (consecutive
--          create failures), open_until (server time), opened (times it opened),
--          last_error (the failure that counted last)
-- ARGV[1]  operation: 'failure' | 'success'
-- ARGV[2]  threshold: consecutive failures that open the circuit (failure)
-- ARGV[3]  cool-down in seconds (failure)
-- ARGV[4]  the failure's message (failure)
-- Returns: failure -> {opened_now (1|0), failures, open_until ('' when closed)};
--          success -> {0, 0, ''}.
-- Invariant: the circuit opens exactly once per run of `threshold` consecutive failures
-- however many workers fail together (the count and the check are one atomic unit), and
-- a failure after the cool-down, with the count still at the threshold, opens it again
-- at once (creates are let through again after the cool-down; only a success closes it).
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
if ARGV[1] == 'success' then
  redis.call('HSET', KEYS[1], 'failures', 0)
  redis.call('HDEL', KEYS[1], 'open_until')
  return {0, 0, ''}
end
local failures = redis.call('HINCRBY', KEYS[1], 'failures', 1)
redis.call('HSET', KEYS[1], 'last_error', ARGV[4])
local open_until = tonumber(redis.call('HGET', KEYS[1], 'open_until') or '0')
if failures >= tonumber(ARGV[2]) and open_until <= now then
  local until_ = string.format('%.6f', now + tonumber(ARGV[3]))
  redis.call('HSET', KEYS[1], 'open_until', until_)
  redis.call('HINCRBY', KEYS[1], 'opened', 1)
  return {1, failures, until_}
end
if open_until > now then
  return {0, failures, string.format('%.6f', open_until)}
end
return {0, failures, ''}
