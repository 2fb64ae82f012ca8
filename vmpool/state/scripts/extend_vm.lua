-- extend_vm.lua: PUT /vm/<hostname> {"lifetime": hours}: a held VM's lifetime, in hours
-- from its checkout (vmpooler's meaning), set anew (running -> running).
-- KEYS: as give_back.lua (pool layout or request layout).
-- ARGV: 1-4 as in _prelude.lua (4: the VM's request id, '' for none); 5 VM name;
--   6 the caller's user ('' for admin or auth off); 7 lifetime hours (> 0; the API
--   checks the upper limit).
-- Returns: {1, 'extended', version} or {0, 'no_vm' | 'wrong_request' | 'vm_<state>' |
--   'forbidden'}.
-- Invariant: only a held VM's lifetime changes, by its holder, and its running score
-- (the reaper's index) moves in the same unit; the request's records outlive the VM.
local vm, refusal = held_vm_for(ARGV[6])
if refusal then
  return refusal
end
local now = server_now()
local start = tonumber(vm.checkout_at or vm.ready_at or fmt(now))
local lifetime_end = start + tonumber(ARGV[7]) * 3600
move_vm(KEYS[7], vm, 'running', now, fmt(lifetime_end), '')
redis.call('HSET', KEYS[7], 'lifetime_end', fmt(lifetime_end), 'lifetime_hours', ARGV[7])
if RID ~= '' then
  if not request_of(vm) then
    return {1, 'extended', -1}
  end
  -- the request's keys (and so its trail) outlive the VM by data_ttl
  local ms = math.floor((lifetime_end - now + tonumber(vm.data_ttl)) * 1000)
  for i = 1, 4 do
    local left = redis.call('PTTL', KEYS[i])
    if left >= 0 and left < ms then
      redis.call('PEXPIRE', KEYS[i], ms)
    end
  end
end
return {1, 'extended', audit('vm:' .. vm.name, 'running', 'running',
  'lifetime set to ' .. ARGV[7] .. 'h', now)}
