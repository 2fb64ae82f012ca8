-- clone_semaphore.lua: the fleet-wide on-demand clone limit (ondemand_clone_limit), a
-- counting semaphore of leases shared by every worker process on every machine.
-- Not a store script: vmpool/state/semaphore.py loads it alone (no transition tables),
-- after _slots.lua (the leases' functions, shared with the store scripts that take a
-- slot in a reservation and give it back at the VM's create), binding its keys first:
-- CLONE_SLOTS, SLOT_HOLDERS, SLOT_STATS, SLOT_LINE are KEYS[1] .. KEYS[4].
-- KEYS[1]  the lease zset (keys.clone_slots): member = VM name, score = the lease's
--          end, in Redis server time (seconds)
-- KEYS[2]  hash (keys.clone_slot_holders): VM name -> its holder's token, an integer:
--          the fencing token of the VM lock it was taken under, 0 when taken at the
--          VM's reservation (before any lock of it)
-- KEYS[3]  hash (keys.clone_slot_stats): peak (most live leases seen at once),
--          overruns (renewals that found their lease gone and no slot free)
-- KEYS[4]  zset (keys.clone_slot_line): requests that found no slot free -> their place
--          in line (scripts/_line.lua); reserve_vm.lua takes a request out once it has
--          its VMs, close_request (the request left pending) and quota_park.lua too,
--          and a provision that finds the request past its TTL (leave_line in
--          vmpool/state/semaphore.py)
-- KEYS[5]  join only: the request's hash (keys.request)
-- ARGV[1]  operation: 'acquire' | 'acquire_all' | 'renew' | 'release' |
--          'release_to_line' | 'count' | 'turns' | 'join' (a request's VM takes its
--          slot in its turn in reserve_vm.lua's unit: _slots.lua slot_acquire_in_line)
-- acquire:     ARGV[2] VM name, ARGV[3] token, ARGV[4] limit, ARGV[5] lease seconds
-- turns:       ARGV[2] limit
-- acquire_all: ARGV[2] limit, ARGV[3] lease seconds, ARGV[4..] VM name, token pairs
-- renew:       ARGV[2] VM name, ARGV[3] token, ARGV[4] limit, ARGV[5] lease seconds
-- release:     ARGV[2] VM name, ARGV[3] token
-- release_to_line: as release, then ARGV[4] limit
-- join:        ARGV[2] the request's id, ARGV[3] its place: a request a provision batch
--              left unreserved behind an older one refused a slot waits in line too
--              (a pending request with `unreserved` above 0 only)
-- Returns: acquire -> 1 granted (a new lease, or the VM's lease renewed or taken over:
--            its token was not newer than ours), 0 refused (no slot free, or a newer
--            holder of the VM has it);
--          acquire_all -> per VM, in order, what acquire returns, each in turn;
--          renew -> 1 renewed (or retaken: it had lapsed and a slot was free), 2 a
--            newer holder has it (stop renewing), 3 it had lapsed and no slot was
--            free: re-registered over the limit and counted as an overrun (the
--            create is under way; the count stays true, so no new slot is granted
--            until it is back under the limit);
--          release -> 1 if the lease was dropped (it was ours or an older holder's),
--            0 otherwise; release_to_line -> {1, the requests whose turn it is, as
--            turns} when the lease was dropped, {0} otherwise (the caller hands the
--            slot to the first in line at once); count -> the number of live leases;
--            turns -> the first requests of KEYS[4], as many as slots are free;
--            join -> 1 if the request is pending with VMs to reserve (in line at its
--            place, or already there), 0 otherwise (nothing written: an ended or
--            fully reserved request never waits).
-- Invariant: _slots.lua's (the limit, each lease released or renewed only by its
-- holder, expired leases dropped first, the peak, the order of the line).
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
slots_drop_expired(now)
local op = ARGV[1]
if op == 'count' then
  return redis.call('ZCARD', CLONE_SLOTS)
end

local function lease_end(seconds)
  return string.format('%.6f', now + tonumber(seconds))
end

if op == 'acquire' then
  return slot_acquire(ARGV[2], ARGV[3], tonumber(ARGV[4]), lease_end(ARGV[5]), now)
end
if op == 'turns' then
  return slot_turns(tonumber(ARGV[2]), now)
end
if op == 'acquire_all' then
  local expiry = lease_end(ARGV[3])
  local out = {}
  for i = 4, #ARGV, 2 do
    out[#out + 1] = slot_acquire(ARGV[i], ARGV[i + 1], tonumber(ARGV[2]), expiry, now)
  end
  return out
end
if op == 'renew' then
  local name, token = ARGV[2], ARGV[3]
  if redis.call('ZSCORE', CLONE_SLOTS, name) then
    if slot_holder(name) ~= tonumber(token) then
      return 2
    end
    redis.call('ZADD', CLONE_SLOTS, lease_end(ARGV[5]), name)
    return 1
  end
  local live = redis.call('ZCARD', CLONE_SLOTS)
  slot_take(name, token, lease_end(ARGV[5]), live + 1)
  if live >= tonumber(ARGV[4]) then
    redis.call('HINCRBY', SLOT_STATS, 'overruns', 1)
    return 3
  end
  return 1
end
if op == 'release' then
  return slot_release(ARGV[2], ARGV[3])
end
if op == 'join' then
  -- a request with no VM left to reserve never waits: its last reservation took it out
  -- of the line, and its fulfil (close_request) counts on that
  local req = redis.call('HMGET', KEYS[5], 'status', 'unreserved')
  if req[1] ~= 'pending' or (tonumber(req[2] or '') or 0) <= 0 then
    return 0
  end
  redis.call('ZADD', SLOT_LINE, 'NX', ARGV[3], ARGV[2])
  return 1
end
if op == 'release_to_line' then
  if slot_release(ARGV[2], ARGV[3]) == 0 then
    return {0}
  end
  local out = {1}
  for _, rid in ipairs(slot_turns(tonumber(ARGV[4]), now)) do
    out[#out + 1] = rid
  end
  return out
end
return redis.error_reply('clone_semaphore: unknown operation ' .. tostring(op))
