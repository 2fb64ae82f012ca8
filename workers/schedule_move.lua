-- schedule_move.lua: move one periodic template from the due time a replica read to the
-- next, and log the move, as one unit.
--
-- KEYS[1]  the schedule: sorted set, template id -> next due time (Redis server time)
-- KEYS[2]  the schedule log: list, newest first, capped
-- ARGV[1]  template id
-- ARGV[2]  the due time the caller read (its score then)
-- ARGV[3]  the next due time
-- ARGV[4]  the log row
-- ARGV[5]  the log's length cap
-- Returns  1 if this call moved the template, 0 if its score is no longer ARGV[2]
--          (another replica moved it, or it was removed).
--
-- Invariant: each due time of a template is moved, and logged, at most once, and a
-- template's due time only ever goes forward. A replica that read the schedule and then
-- paused (SIGSTOP, GC, a slow network) cannot push another replica's next due time back
-- or forward when it resumes. Scores compare exactly: both sides are the same double,
-- printed by Redis and parsed back by the caller.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[1])
redis.call('LPUSH', KEYS[2], ARGV[4])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[5]) - 1)
return 1
