-- delete_request.lua: the client gives the request back (pending|ready -> deleted);
-- every live VM of it goes to destruction.
-- KEYS: 1-6 as in _prelude.lua.
-- ARGV: 1-4 as in _prelude.lua; 5 the deleting token's user ('' skips the ownership
--   check: admin, or auth off).
-- Returns: {1, 'deleted', version} or {0, 'no_request' | 'already_deleted' |
--   'request_failed' | 'forbidden'}.
-- Invariant: terminal states are absorbing: a failed request stays failed and a
-- deleted one is not deleted twice; a token deletes only its own user's requests.
-- Metrics: a pending request deleted here counts as finished (deleted); a ready one
-- was counted when it became ready and is not counted again.
local req = load_hash(KEYS[1])
if not req then
  return refuse('no_request')
end
if req.status == 'deleted' then
  return refuse('already_deleted')
end
if req.status == 'failed' then
  return refuse('request_failed')
end
local owner = req.token_user or ''
if ARGV[5] ~= '' and owner ~= '' and owner ~= ARGV[5] then
  return refuse('forbidden')
end
local now = server_now()
local v = set_status(req, 'deleted', 'deleted by ' .. ACTOR, now)
if not v then
  return refuse('request_' .. req.status)
end
release_vms('request deleted', now)
close_request(req, tonumber(req.data_ttl))
return {1, 'deleted', tonumber(redis.call('HGET', KEYS[1], 'version'))}
