-- vm_task_done.lua: the vm_task job carried out (or failed) a VM's snapshot, revert or
-- disk task: the result is recorded as vmpooler records it (snapshot:<id> = the time
-- it was taken; disk = '+<n>gb:+<m>gb...'), and the task leaves the VM.
-- KEYS: as give_back.lua (pool layout or request layout).
-- ARGV: 1-4 as in _prelude.lua (4: the VM's request id, '' for none); 5 VM name; 6 kind;
--   7 task id; 8 '1' done or '0' failed; 9 why it failed ('' when done).
-- Returns: {1, 'done' | 'failed', version} or {0, 'no_vm' | 'wrong_request' | 'no_task'}.
-- Invariant: a task is finished once (a job run twice finds no task the second time);
-- a missing record is never recreated; a held VM's trail tells each result.
local vm, refusal = load_vm('')
if refusal then
  return refusal
end
local kind, id = ARGV[6], ARGV[7]
local field = 'task:' .. kind .. ':' .. id
local arg = redis.call('HGET', KEYS[7], field)
if not arg then
  return refuse('no_task')
end
redis.call('HDEL', KEYS[7], field)
local now = server_now()
local code, what = 'done', kind .. ' ' .. id .. ' done'
if ARGV[8] == '1' then
  if kind == 'snapshot' then
    redis.call('HSET', KEYS[7], 'snapshot:' .. id, fmt(now))
  elseif kind == 'disk' then
    local disks = redis.call('HGET', KEYS[7], 'disk')
    redis.call('HSET', KEYS[7], 'disk', (disks and (disks .. ':') or '') .. '+' .. arg .. 'gb')
  end
else
  code, what = 'failed', kind .. ' ' .. id .. ' failed: ' .. ARGV[9]
end
if vm.state ~= 'running' or (RID ~= '' and not request_of(vm)) then
  return {1, code, -1}
end
return {1, code, audit('vm:' .. vm.name, 'running', 'running', what, now)}
