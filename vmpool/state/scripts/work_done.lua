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
local asked = {}
for i = 4, #ARGV do
  asked[#asked + 1] = ARGV[i]
end
if #asked == 0 then
  return 0
end
local holders = ws_call('HMGET', W.claimed, asked)
local mine = {}
for i, subject in ipairs(asked) do
  if holders[i] == id then
    mine[#mine + 1] = subject
  end
end
if #mine == 0 then
  return 0
end
if mode == 'done' then
  ws_call('ZREM', W.base, mine)
  ws_call('ZREM', W.claims, mine)
  ws_call('HDEL', W.claimed, mine)
  ws_call('HDEL', W.owner, mine)
elseif mode == 'release' then
  ws_requeue(W, mine)
elseif mode == 'defer' or mode == 'renew' then
  local until_ = ws_fmt(ws_now() + tonumber(ARGV[3]))
  local leases = {}
  for _, subject in ipairs(mine) do
    leases[#leases + 1] = until_
    leases[#leases + 1] = subject
  end
  ws_call('ZADD', W.claims, leases, 2)
  if mode == 'defer' then
    ws_call('HDEL', W.claimed, mine)
  end
else
  return redis.error_reply('work_done: unknown mode ' .. tostring(mode))
end
return #mine
