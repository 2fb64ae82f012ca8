-- schedule_move.lua: move one periodic template from the due time a replica read to the
-- next, log the move, and record the run it queued, as one unit.
--
-- KEYS[1]  the schedule: sorted set, template id -> next due time (Redis server time)
-- KEYS[2]  the schedule log: list, newest first, capped
-- KEYS[3]  the last runs: hash, job name -> RQ job id of its latest scheduled run
-- ARGV[1]  template id
-- ARGV[2]  the due time the caller read (its score then)
-- ARGV[3]  the next due time
-- ARGV[4]  the log row
-- ARGV[5]  the log's length cap
-- ARGV[6]  the job name
-- ARGV[7]  the run's RQ job id, or '' when no run was queued for this due time (the
--          previous one was still waiting in its queue)
-- Returns  1 if this call moved the template, 0 if its score is no longer ARGV[2]
--          (another replica moved it, or it was removed).
--
-- Invariant: each due time of a template is moved, and logged, at most once, and a
-- template's due time only ever goes forward. A replica that read the schedule and then
-- paused (SIGSTOP, GC, a slow network) cannot push another replica's next due time back
-- or forward, nor change the recorded last run, when it resumes. Scores compare exactly:
-- both sides are the same double, printed by Redis and parsed back by the caller.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[1])
redis.call('LPUSH', KEYS[2], ARGV[4])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[5]) - 1)
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[3], ARGV[6], ARGV[7])
end
return 1
