-- _once.lua: a mutating script answered once per operation id, however often it is sent
-- (vmpool/state/ops.py composes it around a script's body: ops.once_text).
--
-- The caller appends three arguments to the script's own, which are removed here
-- before the body reads ARGV (so the body's ARGV, and #ARGV, are its own):
--   ARGV[n-2] the operation's key (Keys.op: P:op:<id>), '' for no operation
--   ARGV[n-1] how long its record is kept, in milliseconds
--   ARGV[n]   a fingerprint of what was asked ('' for none: the id alone names the call)
-- The id is made once per logical call, before its first send, so a client's retry
-- (redis-py's, after a reply lost or late) sends the same id again.
--
-- Returns: the body's reply, or the recorded reply of the first run of this id; an
--   error reply 'OPMISMATCH ...' when the id was first used with another fingerprint.
--
-- Invariant: one operation id changes the data at most once. The reply of a run that
-- changed something is recorded in the same atomic unit as the change, so no crash or
-- lost reply can separate them; a repeat runs nothing and answers the first reply.
-- A refusal ({0, ...}: it changed nothing) and an error reply are not recorded: its
-- repeat is a fresh attempt, as if the first had never been made, and a refusal stays
-- free of writes. The record is written after the change: Redis refuses a script for
-- memory (a full Redis) only at its first write, so a full Redis refuses what it
-- refused before and records every change it lets start. A repeat renews the record's
-- TTL (allowed when Redis is full): that write moves the caller's replication offset
-- past the first run, so the WAIT sent after it confirms the first run's change
-- (vmpool/state/durability.py).
local OP_PRINT = table.remove(ARGV)
local OP_TTL = table.remove(ARGV)
local OP_KEY = table.remove(ARGV)

local function once(body)
  if OP_KEY == nil or OP_KEY == '' then
    return body()
  end
  local held = redis.call('GET', OP_KEY)
  if held then
    local record = cmsgpack.unpack(held)
    if record[1] ~= OP_PRINT then
      return redis.error_reply('OPMISMATCH operation id reused for another call')
    end
    redis.call('PEXPIRE', OP_KEY, OP_TTL)
    return record[2]
  end
  local reply = body()
  if type(reply) ~= 'table' or (reply[1] ~= 0 and not reply.err) then
    redis.call('SET', OP_KEY, cmsgpack.pack({OP_PRINT, reply}), 'PX', OP_TTL)
  end
  return reply
end
