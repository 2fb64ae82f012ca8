-- tag_vm.lua: PUT /vm/<hostname> {"tags": {...}}: tags on a held VM (vmpooler's
-- tag:<name> fields; running -> running).
-- KEYS: as give_back.lua (pool layout or request layout).
-- ARGV: 1-4 as in _prelude.lua (4: the VM's request id, '' for none); 5 VM name;
--   6 the caller's user ('' for admin or auth off); 7, 8, ... tag name, value, ...
--   (already filtered by the API's tagfilter).
-- Returns: {1, 'tagged', version} or {0, 'no_vm' | 'wrong_request' | 'vm_<state>' |
--   'forbidden' | 'no_tags'}.
-- Invariant: only a held VM is tagged, by its holder; each tagging is in the trail.
-- Summary: each non-empty tag joins the day's tag summary (vmpooler's export_tags).
local vm, refusal = held_vm_for(ARGV[6])
if refusal then
  return refusal
end
if #ARGV < 8 then
  return refuse('no_tags')
end
local now = server_now()
local names = {}
for i = 7, #ARGV - 1, 2 do
  redis.call('HSET', KEYS[7], 'tag:' .. ARGV[i], ARGV[i + 1])
  if ARGV[i + 1] ~= '' then
    count_daily('tag', vm.name .. ':' .. ARGV[i], ARGV[i + 1], now)
  end
  table.insert(names, ARGV[i])
end
if RID ~= '' and not request_of(vm) then
  return {1, 'tagged', -1}
end
return {1, 'tagged', audit('vm:' .. vm.name, 'running', 'running',
  'tagged ' .. table.concat(names, ','), now)}
