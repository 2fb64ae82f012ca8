-- job_heartbeat.lua: the vmpool heartbeat of a running RQ job, in Redis server time.
--
-- KEYS[1]  the job hash (rq:job:<id>)
-- ARGV[1]  the heartbeat field (workers.queues.HEARTBEAT_FIELD)
-- Returns  1 if written, 0 if the job hash is gone.
--
-- Invariant: a heartbeat never recreates a job hash that finished (result_ttl=0
-- deletes it) or was reclaimed; reclaim_job.lua reads this field to tell a live
-- running job from a dead one.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.3f', now))
return 1
