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
-- tombstone), so an older counter already has its TTL, or its subject none. A record
-- read here (ARGV[3]) tells its TTL without a PTTL when it has none: no record (-2), or
-- one still live, which has no TTL (a request gets one when it leaves pending, a VM
-- when it is destroyed: close_request, keep_tombstone, _pool.lua's tombstone).

-- The subject's TTL as PTTL answers it, for a counter this grant made (``record``: the
-- subject's flat HGETALL when read, else nil).
local function subject_ttl(subject, record)
  if record then
    if #record == 0 then
      return -2
    end
    for j = 1, #record, 2 do
      local field, value = record[j], record[j + 1]
      if (field == 'status' and value == 'pending')
        or (field == 'state' and value ~= 'destroyed') then
        return -1
      end
    end
  end
  return redis.call('PTTL', subject)
end

local out = {}
for i = 1, #KEYS / 3 do
  local lock, fence, subject = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local token = 0
  local record = {}
  if redis.call('SET', lock, ARGV[3 + i], 'NX', 'PX', ARGV[2]) then
    token = redis.call('INCR', fence)
    local read = nil
    if ARGV[3] == '1' then
      record = redis.call('HGETALL', subject)
      read = record
    end
    if token == 1 then
      local ttl = subject_ttl(subject, read)
      if ttl > 0 then
        redis.call('PEXPIRE', fence, ttl)
      elseif ttl == -2 and ARGV[1] ~= '' then
        redis.call('PEXPIRE', fence, ARGV[1])
      end
    end
  end
  out[i] = {token, record}
end
return out
