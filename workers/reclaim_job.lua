-- reclaim_job.lua: delete a job hash whose unique id is held by a job that is plainly
-- dead, so that the enqueue which found the duplicate can go through.
--
-- KEYS[1]  the job hash (rq:job:<id>)
-- ARGV[1]  the heartbeat field vmpool's workers write into a popped or running job's hash
-- ARGV[2]  seconds after which a heartbeat is stale
-- Returns  1 if the id is free now (no hash, or this call deleted a dead one), 0 if a
--          live copy holds it.
--
-- Dead means: 'failed', 'stopped' or 'canceled'; 'queued' or 'started' with a heartbeat
-- older than ARGV[2] (Redis server time). A vmpool worker pops a job and stamps its
-- heartbeat in one unit (pop_job.lua) and beats while it runs it, so a 'queued' hash
-- with a heartbeat was popped, and one whose beat went stale was popped by a worker
-- that died (or lost the pop's reply with its connection) before it marked the job
-- started: nothing would ever run that hash, and RQ never expires it. A 'queued' hash
-- without a heartbeat is in its queue: live. A 'started' job without a heartbeat is
-- left to RQ. Every check is O(1): nothing here grows with the queue.
-- Invariant: a live job (queued in its queue, or popped/running with a fresh
-- heartbeat) is never deleted, so unique ids keep at most one live copy of each
-- (job, subject).
-- (The status and the heartbeat in one HMGET: a live lane costs one call.)
local got = redis.call('HMGET', KEYS[1], 'status', ARGV[1])
local status = got[1]
if not status then return 1 end
if status == 'failed' or status == 'stopped' or status == 'canceled' then
  redis.call('DEL', KEYS[1]); return 1
end
if status == 'queued' or status == 'started' then
  local hb = tonumber(got[2])
  if hb == nil then return 0 end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  if now - hb > tonumber(ARGV[2]) then redis.call('DEL', KEYS[1]); return 1 end
end
return 0
