-- work_done.lua: end or extend a batch job's claim on some of its subjects, each only
-- if the claim still holds it (_workset.lua, prepended with WORK_PARTS;
-- vmpool/state/workset.py loads it).
-- KEYS[1]  the work set (keys.work_set(job))
-- ARGV[1]  the claim's id (work_claim.lua's ARGV[3])
-- ARGV[2]  'done' (the subject's work is over: it leaves the set), 'release' (not run:
--          back in line at once, at its arrival), 'defer' (not run now: back in line
--          at its arrival after ARGV[3] seconds, held by no claim meanwhile) or 'renew'
--          (still being worked on: the lease ends ARGV[3] seconds from now)
-- ARGV[3]  seconds (defer, renew); ignored otherwise
-- ARGV[4..] the subjects
-- Returns: how many subjects the claim still held (and so were changed).
-- Invariant: a subject whose lease ran out, and which went back in line or to another
-- claim, is not touched by the first claimer: the newer claim owns it. A deferred
-- subject stays in the set (its dedup): a dispatch meanwhile does not add it twice.
local W = ws_parts(KEYS[1])
local id, mode = ARGV[1], ARGV[2]
local until_ = ''
if mode == 'defer' or mode == 'renew' then
  until_ = ws_fmt(ws_now() + tonumber(ARGV[3]))
end
local n = 0
for i = 4, #ARGV do
  local subject = ARGV[i]
  if redis.call('HGET', W.claimed, subject) == id then
    n = n + 1
    if mode == 'done' then
      redis.call('ZREM', W.base, subject)
      redis.call('ZREM', W.claims, subject)
      redis.call('HDEL', W.claimed, subject)
      redis.call('HDEL', W.owner, subject)
    elseif mode == 'release' then
      ws_requeue(W, subject)
    elseif mode == 'defer' then
      redis.call('ZADD', W.claims, until_, subject)
      redis.call('HDEL', W.claimed, subject)
    elseif mode == 'renew' then
      redis.call('ZADD', W.claims, until_, subject)
    else
      return redis.error_reply('work_done: unknown mode ' .. tostring(mode))
    end
  end
end
return n
