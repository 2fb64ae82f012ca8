-- pop_job.lua: a worker's dequeue: pop the first job id of the first non-empty queue and
-- stamp the job's hash with the vmpool heartbeat (Redis server time), in one unit.
--
-- KEYS     the queue lists (rq:queue:<name>), in the order the worker tries them
--          (workers/turns.py: the sweeps, then the others in turn order), then each
--          queue's wake-up list (Keys.rq_queue_wake), in the same order
-- ARGV[1]  the prefix of RQ's job hashes ("rq:job:")
-- ARGV[2]  the heartbeat field (workers.queues.HEARTBEAT_FIELD)
-- Returns  {queue key, job id}, or nil when every queue is empty. An id whose hash is
--          gone is returned unstamped (RQ skips it, as it does after BLPOP).
--
-- Invariant: a job id leaves its queue only together with a heartbeat on its hash. So a
-- 'queued' hash without a heartbeat is still in its queue, and one with a heartbeat was
-- popped; reclaim_job.lua tells the live from the dead in O(1) (no LPOS over the queue):
-- a popped job whose runner died stops beating and is reclaimed once the beat is stale.
--
-- Wake-ups (workers/dequeue.py): a worker that found its queues empty blocks on their
-- wake-up lists, and every push of a job puts one token in its queue's. A queue still
-- holding jobs after this pop gets a token too, for the next idle worker (one push of
-- many jobs wakes one worker, which wakes the next). When every queue is empty their
-- tokens are dropped in the same unit, so no push after it goes unseen and no earlier
-- token wakes a worker for nothing.
local n = #KEYS / 2
for i = 1, n do
  local queue = KEYS[i]
  local id = redis.call('LPOP', queue)
  if id then
    local key = ARGV[1] .. id
    if redis.call('EXISTS', key) == 1 then
      local t = redis.call('TIME')
      local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
      redis.call('HSET', key, ARGV[2], string.format('%.3f', now))
    end
    if redis.call('LLEN', queue) > 0 and redis.call('EXISTS', KEYS[n + i]) == 0 then
      redis.call('RPUSH', KEYS[n + i], '1')
    end
    return {queue, id}
  end
end
redis.call('DEL', unpack(KEYS, n + 1))
return nil
