-- lanes_probe.lua: add subjects to a batch job's work set, then find which of the probed
-- lanes of that batch job are free, in one script (issue 15: one round trip per dispatch,
-- where a pipeline of one reclaim script per job id cost a SCRIPT EXISTS round trip too).
--
-- workers/batching.py prepends reclaim_job.lua's text as the function
-- `reclaim(KEYS, ARGV)` (its KEYS[1] one job hash, its ARGV the two below): a job id is
-- free here exactly when it is free for every unique enqueue.
--
-- KEYS[1]  the work set (zset, vmpool.state.workset.WorkSet)
-- KEYS[2..] the job hashes of the probed lanes, two per lane, lane by lane: the lane's
--          id, then its continuation's id
-- ARGV[1]  the heartbeat field of a popped or running job's hash
-- ARGV[2]  seconds after which a heartbeat is stale
-- ARGV[3]  how many free lanes are wanted (at most that many are returned)
-- ARGV[4..] subjects to add (ZADD NX, score 0: claimable now; one already in keeps its
--          score, as WorkSet.add)
-- Returns  the positions (1-based, in probe order) of up to ARGV[3] lanes whose two ids
--          are both free.
-- Invariant: as reclaim_job.lua's, a live job is never deleted (so a lane id keeps at
-- most one live copy); the subjects are in the set before any lane is checked, so a
-- batch job found live will see them. A lane whose first id is live is not checked
-- further (it is not free whatever its second id).
local CHUNK = 500  -- members per ZADD: unpack() has a stack limit
local n = #ARGV
for first = 4, n, CHUNK do
  local args = {}
  for i = first, math.min(n, first + CHUNK - 1) do
    args[#args + 1] = 0
    args[#args + 1] = ARGV[i]
  end
  redis.call('ZADD', KEYS[1], 'NX', unpack(args))
end
local want = tonumber(ARGV[3])
local check = {ARGV[1], ARGV[2]}
local free = {}
for i = 2, #KEYS, 2 do
  if #free >= want then
    break
  end
  if reclaim({KEYS[i]}, check) == 1 and reclaim({KEYS[i + 1]}, check) == 1 then
    free[#free + 1] = i / 2
  end
end
return free
