-- work_done.lua: end a batch job's claim on subjects: remove them (done) or make them
-- claimable again at once (released unprocessed), if still its claim.
-- Not a store script: vmpool/state/workset.py loads it alone.
-- KEYS[1]  the work set (keys.work_set(job))
-- ARGV[1]  the claim score work_claim.lua returned
-- ARGV[2]  'done' (remove) or 'release' (score 0: claimable now)
-- ARGV[3..] the subjects
-- Returns: how many were removed or released.
-- Invariant: a subject whose lease ran out and was claimed again by another batch job
-- (a new score) is not touched by the first claimer: the newer claim owns it.
local n = 0
for i = 3, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and string.format('%.3f', tonumber(score)) == ARGV[1] then
    if ARGV[2] == 'done' then
      n = n + redis.call('ZREM', KEYS[1], ARGV[i])
    else
      redis.call('ZADD', KEYS[1], 'XX', 0, ARGV[i])
      n = n + 1
    end
  end
end
return n
