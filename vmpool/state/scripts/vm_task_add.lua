-- vm_task_add.lua: POST /vm/<host>/snapshot, /snapshot/<id>, /disk/<size>: the holder
-- of a VM asks for a snapshot, a revert or an extra disk. The task is recorded on the
-- VM (field task:<kind>:<id> = its argument) for the vm_task job to carry out.
-- KEYS: as give_back.lua (pool layout or request layout).
-- ARGV: 1-4 as in _prelude.lua (4: the VM's request id, '' for none); 5 VM name; 6 the
--   caller's user ('' for admin or auth off); 7 kind: snapshot | revert | disk; 8 the
--   task's id (a snapshot's is the snapshot's name); 9 its argument (disk: size in GB;
--   revert: the snapshot's id; snapshot: '').
-- Returns: {1, 'queued', version} or {0, 'no_vm' | 'wrong_request' | 'vm_<state>' |
--   'forbidden' | 'no_snapshot' | 'task_exists'}.
-- Invariant: only the holder of a held VM asks; a revert names a snapshot that was
-- taken (vmpooler's check); a task id is used once per VM; each ask is in the trail.
local vm, refusal = held_vm_for(ARGV[6])
if refusal then
  return refusal
end
local kind, id, arg = ARGV[7], ARGV[8], ARGV[9]
if kind == 'revert' and not redis.call('HGET', KEYS[7], 'snapshot:' .. arg) then
  return refuse('no_snapshot')
end
local field = 'task:' .. kind .. ':' .. id
local taken = kind == 'snapshot' and redis.call('HEXISTS', KEYS[7], 'snapshot:' .. id) == 1
if taken or redis.call('HEXISTS', KEYS[7], field) == 1 then
  return refuse('task_exists')
end
redis.call('HSET', KEYS[7], field, arg)
local now = server_now()
if RID ~= '' and not request_of(vm) then
  return {1, 'queued', -1}
end
local what = kind .. ' ' .. id
if arg ~= '' then
  what = what .. ' (' .. arg .. ')'
end
return {1, 'queued', audit('vm:' .. vm.name, 'running', 'running', what .. ' asked', now)}
