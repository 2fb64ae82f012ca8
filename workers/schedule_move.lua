-- schedule_move.lua: move one periodic template from the due time a replica read to the
-- next, log the move, and record the run it queued, as one unit. For the pending sweep
-- (the job that parks: workers/schedule_park.py), also decide in the same unit whether
-- it parks.
--
-- KEYS[1]  the schedule: sorted set, template id -> next due time (Redis server time)
-- KEYS[2]  the schedule log: list, newest first, capped
-- KEYS[3]  the last runs: hash, job name -> RQ job id of its latest scheduled run
-- KEYS[4]  (parking job only) its parked mark: string, the earliest next due time
-- KEYS[5..] (parking job only) its inputs: every pool's reserved and pending VMs, the
--          claims of the work sets it dispatches again (vmpool.lifecycle.idle)
-- ARGV[1]  template id
-- ARGV[2]  the due time the caller read (its score then)
-- ARGV[3]  the next due time
-- ARGV[4]  the log row
-- ARGV[5]  the log's length cap
-- ARGV[6]  the job name
-- ARGV[7]  the run's RQ job id, or '' when no run was queued for this due time (the
--          previous one was still waiting in its queue, or it had nothing to do)
-- ARGV[8]  (parking job only) the mark's value: the earliest next due time on a wake-up
-- ARGV[9]  (parking job only) the next due time when parked (its safety tick)
-- ARGV[10] (parking job only) the log row when parked
-- Returns  0 if its score is no longer ARGV[2] (another replica moved it, or it was
--          removed), else 1 (moved), or 2 (moved and parked: no input exists; the mark
--          is set) for the parking job, whose mark is cleared when it does not park.
--
-- Invariant: each due time of a template is moved, and logged, at most once, and a
-- template's due time only ever goes forward. A replica that read the schedule and then
-- paused (SIGSTOP, GC, a slow network) cannot push another replica's next due time back
-- or forward, nor change the recorded last run, when it resumes. Scores compare exactly:
-- both sides are the same double, printed by Redis and parsed back by the caller.
-- And no reservation is missed by a park: a reservation (_prelude.lua's move_vm) runs
-- before this unit, and its VM is an input, or after it, and it finds the mark and wakes
-- the schedulers. A VM is only ever pending after being reserved.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then
  return 0
end
local moved, next_due, row = 1, ARGV[3], ARGV[4]
if #KEYS >= 4 then
  if #KEYS >= 5 and redis.call('EXISTS', unpack(KEYS, 5)) > 0 then
    redis.call('DEL', KEYS[4])
  else
    redis.call('SET', KEYS[4], ARGV[8])
    moved, next_due, row = 2, ARGV[9], ARGV[10]
  end
end
redis.call('ZADD', KEYS[1], 'XX', next_due, ARGV[1])
redis.call('LPUSH', KEYS[2], row)
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[5]) - 1)
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[3], ARGV[6], ARGV[7])
end
return moved
