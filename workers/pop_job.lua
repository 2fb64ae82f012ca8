-- pop_job.lua: a worker's dequeue: pop the first job id of the first non-empty queue and
-- stamp the job's hash with the vmpool heartbeat (Redis server time), in one unit.
--
-- KEYS     the queue lists (rq:queue:<name>), in the worker's priority order
-- ARGV[1]  the prefix of RQ's job hashes ("rq:job:")
-- ARGV[2]  the heartbeat field (workers.queues.HEARTBEAT_FIELD)
-- Returns  {queue key, job id}, or nil when every queue is empty. An id whose hash is
--          gone is returned unstamped (RQ skips it, as it does after BLPOP).
--
-- Invariant: a job id leaves its queue only together with a heartbeat on its hash. So a
-- 'queued' hash without a heartbeat is still in its queue, and one with a heartbeat was
-- popped; reclaim_job.lua tells the live from the dead in O(1) (no LPOS over the queue):
-- a popped job whose runner died stops beating and is reclaimed once the beat is stale.
for _, queue in ipairs(KEYS) do
  local id = redis.call('LPOP', queue)
  if id then
    local key = ARGV[1] .. id
    if redis.call('EXISTS', key) == 1 then
      local t = redis.call('TIME')
      local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
      redis.call('HSET', key, ARGV[2], string.format('%.3f', now))
    end
    return {queue, id}
  end
end
return nil
