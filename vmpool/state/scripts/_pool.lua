-- _pool.lua: helpers of the warm-pool scripts (vmpool/state/pool_store.py), prepended
-- after _prelude.lua to each of them.
--
-- A warm-pool VM is a VM no request holds (its record's request_id is ''). Until a
-- request claims it, its transitions are audited to its own trail, versioned in its
-- own hash. The warm-pool scripts that act on one VM use the "pool layout" of KEYS,
-- shaped like the request layout so that _prelude.lua's helpers (load_vm, audit,
-- move_vm) work unchanged:
--   KEYS[1] VM hash (the versioned record)   KEYS[2] VM fence
--   KEYS[3] VM trail (Keys.vm_audit)          KEYS[4] VM fence
--   KEYS[5] open-request index                KEYS[6] provision queue
--   KEYS[7] VM hash                           KEYS[8] VM fence
-- with ARGV[4] (the request id) ''. The scripts that act on a held VM (give_back,
-- extend_vm, tag_vm) take either layout: the request layout for a VM a request holds.

-- How many VMs count toward the pool's size: ready ones, and the pool's own (not a
-- request's) reserved and booting ones.
local function warm_count(pool)
  local n = redis.call('ZCARD', pool_index(pool, 'ready'))
  for _, state in ipairs({'reserved', 'pending'}) do
    for _, name in ipairs(redis.call('ZRANGE', pool_index(pool, state), 0, -1)) do
      if redis.call('HGET', VM_PREFIX .. name, 'request_id') == '' then
        n = n + 1
      end
    end
  end
  return n
end

-- The trail of a warm-pool VM (Keys.vm_audit).
local function vm_trail(vm_key)
  return vm_key .. ':audit'
end

-- A destroyed warm-pool VM: its record, fence and trail stay as a tombstone for
-- data_ttl (the name is never reused), then go together.
local function keep_pool_tombstone(vm)
  local ms = math.floor(tonumber(vm.data_ttl) * 1000)
  redis.call('PEXPIRE', KEYS[7], ms)
  redis.call('PEXPIRE', KEYS[8], ms)
  redis.call('PEXPIRE', KEYS[3], ms)
end

-- The one who may give back, extend or tag a held VM: the checkout's owner, or the
-- user of the request holding it ('' when nobody authenticated).
local function holder_of(vm)
  if RID == '' then
    return vm.owner or ''
  end
  local req = request_of(vm)
  return (req and req.token_user) or ''
end

-- '' (admin, or auth off) may act on any VM; a user only on what they hold.
local function may_act(vm, user)
  local holder = holder_of(vm)
  return user == '' or holder == '' or holder == user
end

-- The held VM (ARGV[5]) a per-VM endpoint acts on, if ``user`` may act on it: nil and
-- the refusal otherwise ('no_vm', 'wrong_request', 'vm_<state>' for a VM not held,
-- 'forbidden' for another user's).
local function held_vm_for(user)
  local vm, refusal = load_vm_in('', 'running')
  if refusal then
    return nil, refusal
  end
  if not may_act(vm, user) then
    return nil, refuse('forbidden')
  end
  return vm, nil
end
