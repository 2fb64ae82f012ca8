-- lock_fence.lua: take locks and issue their fencing tokens, each lock in its own
-- check, all in one unit (one lock, or the locks of a batch job's claimed subjects).
-- Not a store script: vmpool/state/locks.py loads it alone (FencedLock.acquire,
-- acquire_all).
-- KEYS     three per lock, lock i at 3i-2 .. 3i:
--          the lock key (keys.lock(kind, subject)); its value is the holder's lock id
--          the fence counter (keys.request_fence(rid) or keys.vm_fence(name))
--          the subject's record (keys.request(rid) or keys.vm(name)), for the TTL
--          (and for the read, ARGV[3])
-- ARGV[1]  TTL in ms for a counter whose subject has no record ('' for none)
-- ARGV[2]  the locks' expiry in ms
-- ARGV[3]  '1': also return each granted subject's record (HGETALL, read in this unit,
--          so after the grant: what a holder reads here no other holder changes);
--          '0': tokens only
-- ARGV[3+i] lock i's holder id (fresh per grant)
-- Returns: per lock, in KEYS order, {token, record}: token >= 1 granted, 0 when another
--          holder has that lock (nothing written for it); record the flat HGETALL reply
--          of its subject (empty when not granted, not asked, or no record).
-- Invariant: a token is issued only together with its lock (SET NX in the same unit),
-- so tokens increase in grant order: a holder whose lock expired (and was granted
-- again) holds a smaller token than the new owner, and every fenced store transition
-- refuses it ('stale_fence'). Each lock is granted or refused on its own: a busy one
-- does not stop the others. The counter never goes back while its subject's record
-- exists: it gets a TTL only when it has none and its subject has one (a tombstone:
-- the counter dies with it) or has no record at all. Only a counter this grant made
-- (token 1) is looked at: a transition that gives a subject its TTL gives its counter
-- the same in its unit (keep_tombstone, close_request, extend_vm, _pool.lua's
-- tombstone), so an older counter already has its TTL, or its subject none.
local out = {}
for i = 1, #KEYS / 3 do
  local lock, fence, subject = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local token = 0
  local record = {}
  if redis.call('SET', lock, ARGV[3 + i], 'NX', 'PX', ARGV[2]) then
    token = redis.call('INCR', fence)
    if token == 1 then
      local subject_ttl = redis.call('PTTL', subject)
      if subject_ttl > 0 then
        redis.call('PEXPIRE', fence, subject_ttl)
      elseif subject_ttl == -2 and ARGV[1] ~= '' then
        redis.call('PEXPIRE', fence, ARGV[1])
      end
    end
    if ARGV[3] == '1' then
      record = redis.call('HGETALL', subject)
    end
  end
  out[i] = {token, record}
end
return out
