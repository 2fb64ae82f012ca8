-- write_probe.lua: can Redis take a write now? (readiness, and a worker waiting out an
-- outage). Not a store script: vmpool/state/redis_health.py loads it alone.
-- KEYS[1]  keys.write_probe
-- ARGV[1]  the probe's expiry in ms
-- Returns: 1. Refused the way every write would be: OOM (maxmemory reached under
--          noeviction), READONLY (a replica), NOREPLICAS (min-replicas-to-write); run
--          through the connection factory's client, its durability is confirmed too.
-- Invariant: none of vmpool's state is touched; the key expires on its own.
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
return 1
