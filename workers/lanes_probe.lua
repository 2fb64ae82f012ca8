-- lanes_probe.lua: add subjects to a batch job's work set, then find which of the probed
-- lanes of that batch job are free, in one script (one round trip per dispatch: a
-- pipeline of one reclaim script per job id costs a SCRIPT EXISTS round trip too).
--
-- workers/batching.py prepends reclaim_job.lua's text as the function
-- `reclaim(KEYS, ARGV)` (its KEYS[1] one job hash, its ARGV the two below): a job id is
-- free here exactly when it is free for every unique enqueue; and the work-set
-- functions (vmpool.state.workset.lua_workset: ws_parts, ws_add_subjects).
--
-- KEYS[1]  the work set (vmpool.state.workset.WorkSet; its parts by suffix)
-- KEYS[2..] the job hashes of the probed lanes, two per lane, lane by lane: the lane's
--          id, then its continuation's id
-- ARGV[1]  the heartbeat field of a popped or running job's hash
-- ARGV[2]  seconds after which a heartbeat is stale
-- ARGV[3]  how many free lanes are wanted (at most that many are returned)
-- ARGV[4]  '' when the subjects are VMs, else what comes before a request id in its
--          hash's key (work_add.lua's ARGV[1]: a request's place is its arrival)
-- ARGV[5]  what comes after a request id in its hash's key
-- ARGV[6..] subjects to add (as WorkSet.add: one already in keeps its place)
-- Returns  the positions (1-based, in probe order) of up to ARGV[3] lanes whose two ids
--          are both free.
-- Invariant: as reclaim_job.lua's, a live job is never deleted (so a lane id keeps at
-- most one live copy); the subjects are in the set before any lane is checked, so a
-- batch job found live will see them. A lane whose first id is live is not checked
-- further (it is not free whatever its second id).
ws_add_subjects(ws_parts(KEYS[1]), ARGV[4], ARGV[5], 6)
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
