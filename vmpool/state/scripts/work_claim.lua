-- work_claim.lua: claim up to N subjects of a work set for one batch job.
-- Not a store script: vmpool/state/workset.py loads it alone.
-- KEYS[1]  the work set (keys.work_set(job)): zset, subject -> visible-from time (s)
-- ARGV[1]  how many to claim at most
-- ARGV[2]  the claim's lease in seconds
-- Returns: {claim score, subject, ...}: the subjects now claimed, with the score they
--          carry while claimed (work_done.lua removes a subject only at that score).
-- Invariant: a subject is claimed by one batch job at a time while its lease runs; a
-- claimer that dies leaves its subjects in the set, visible again once the lease ends
-- (a killed worker loses nothing). Time is the Redis server's.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local found = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%.3f', now),
  'LIMIT', 0, tonumber(ARGV[1]))
local until_ = string.format('%.3f', now + tonumber(ARGV[2]))
local out = {until_}
for _, subject in ipairs(found) do
  redis.call('ZADD', KEYS[1], 'XX', until_, subject)
  out[#out + 1] = subject
end
return out
