-- work_done.lua: remove the subjects a batch job finished, if still its claim.
-- Not a store script: vmpool/state/workset.py loads it alone.
-- KEYS[1]  the work set (keys.work_set(job))
-- ARGV[1]  the claim score work_claim.lua returned
-- ARGV[2..] the subjects done
-- Returns: how many were removed.
-- Invariant: a subject whose lease ran out and was claimed again by another batch job
-- (a new score) is not removed by the first claimer: the newer claim owns it.
local removed = 0
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and string.format('%.3f', tonumber(score)) == ARGV[1] then
    removed = removed + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return removed
