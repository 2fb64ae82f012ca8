-- simulated_list.lua: one page of the simulated cloud's list call, read on the server.
-- KEYS     the VM hashes of the page (keys.sim_vm(provider, name)), in the caller's order
-- ARGV     none
-- returns  {server time "%.6f", then per key in KEYS order: "" when the provider holds
--          no such VM, else "pool\ttemplate\tcreated_at\tready_at\tnever_ready"}
-- invariant: none written (a read); every answer of the page is of one instant, the
--   script's, as a cloud's list page is one snapshot.
local t = redis.call('TIME')
local out = {string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000)}
for i, key in ipairs(KEYS) do
  local v = redis.call('HMGET', key, 'pool', 'template', 'created_at', 'ready_at', 'never_ready')
  if v[1] then
    out[i + 1] = v[1] .. '\t' .. (v[2] or '') .. '\t' .. (v[3] or '0') .. '\t'
      .. (v[4] or '0') .. '\t' .. (v[5] or '0')
  else
    out[i + 1] = ''
  end
end
return out
