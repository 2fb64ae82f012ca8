"""The on-demand lifecycle: what each RQ job does, as plain functions of a :class:`Fleet`.

``workers/`` holds thin RQ entry points; each calls one function here. Every function is
idempotent (safe to run twice, late, or beside a copy of itself): it re-reads the state
it acts on, does provider work only under a fenced lock (:mod:`vmpool.state.locks`), records
the result through one checked store transition, and treats the store's refusals as the
normal answer of a race it lost (logged at debug/info, never raised).

The job graph::

    API / provision_sweep ──> provision_request(rid) ── reserve_vm (n) ──> create_vm(name)
    create_vm ── provider.create ── vm_created ──> check_pending_vm(name)
    check_pending_vm ── provider ready? ── vm_ready (running | fulfilled | completed)
                     └─ past the pool timeout / vanished ── vm_failed ── retry ──> provision_request
    sweep_expired ── expire_request (fulfilled | failed) ──> destroy_vm for released VMs
    reap_running ── end_vm_lifetime ──> destroy_vm
    destroy_sweep ──> destroy_vm ── provider.destroy ── vm_destroyed
    reconcile ── provider inventory, then records: leaks, abandoned reservations, lost VMs

Which lock guards what: ``reserve_vm`` runs under the request's lock (fence from
``keys.request_fence``); ``vm_created``, ``vm_ready``, ``vm_failed`` and ``vm_destroyed``
under the VM's lock (fence from ``keys.vm_fence``). ``expire_request`` and
``end_vm_lifetime`` take no lock: they involve no provider work and their scripts check
everything they need.

Time always comes from the Redis server (``store.server_time()``), never this host.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from redis import Redis
from redis.exceptions import ResponseError

from vmpool.config import Config, PoolConfig
from vmpool.ids import VM_NAME_RE
from vmpool.lifecycle.failpoints import failpoint
from vmpool.providers import Provider, ProviderVM, is_permanent_error, providers_from_config
from vmpool.state.keys import Keys
from vmpool.state.locks import FencedLock, LockBusy, LockKind, LockLost
from vmpool.state.names import NameGenerator
from vmpool.state.semaphore import CloneSemaphore
from vmpool.state.store import Outcome, Store, VMRecord

__all__ = [
    "Dispatcher",
    "Fleet",
    "RecordingDispatcher",
    "check_pending_sweep",
    "check_pending_vm",
    "check_request",
    "create_vm",
    "destroy_sweep",
    "destroy_vm",
    "provision_request",
    "provision_sweep",
    "reap_running",
    "reconcile",
    "sweep_expired",
]

log = logging.getLogger(__name__)

# How many hostnames to draw for one VM before giving up on it this round ('name_taken'
# from reserve_vm means the name exists, tombstones included; collisions are rare).
MAX_NAME_ATTEMPTS = 8

# Refusals of reserve_vm that concern the whole request: stop reserving for it.
_REQUEST_LEVEL_REFUSALS = frozenset({"no_request", "stale_fence", "past_deadline"})


class Dispatcher(Protocol):
    """Puts follow-up work on the queues (workers/queues.py, with RQ). Each call must be
    cheap, idempotent and deduplicated per (job, subject) by the implementation.

    The plural methods are the batched forms the sweeps use: the same effect as the
    singular call for each subject, in a constant number of Redis round trips per batch
    (issue 3: never one round trip per open request per tick)."""

    def provision_request(self, request_id: str) -> None: ...

    def create_vm(self, name: str) -> None: ...

    def check_pending_vm(self, name: str) -> None: ...

    def check_request(self, request_id: str) -> None: ...

    def destroy_vm(self, name: str) -> None: ...

    def provision_requests(self, request_ids: Sequence[str]) -> None: ...

    def create_vms(self, names: Sequence[str]) -> None: ...

    def check_pending_vms(self, names: Sequence[str]) -> None: ...

    def destroy_vms(self, names: Sequence[str]) -> None: ...


@dataclass
class RecordingDispatcher:
    """A Dispatcher that only records what it was asked (tests, ``--dry-run`` tools)."""

    calls: list[tuple[str, str]] = field(default_factory=list)

    def provision_request(self, request_id: str) -> None:
        self.calls.append(("provision_request", request_id))

    def create_vm(self, name: str) -> None:
        self.calls.append(("create_vm", name))

    def check_pending_vm(self, name: str) -> None:
        self.calls.append(("check_pending_vm", name))

    def check_request(self, request_id: str) -> None:
        self.calls.append(("check_request", request_id))

    def destroy_vm(self, name: str) -> None:
        self.calls.append(("destroy_vm", name))

    # A batch is recorded as its singular calls, in order (run_dispatched-style replay).
    def provision_requests(self, request_ids: Sequence[str]) -> None:
        self.calls.extend(("provision_request", rid) for rid in request_ids)

    def create_vms(self, names: Sequence[str]) -> None:
        self.calls.extend(("create_vm", name) for name in names)

    def check_pending_vms(self, names: Sequence[str]) -> None:
        self.calls.extend(("check_pending_vm", name) for name in names)

    def destroy_vms(self, names: Sequence[str]) -> None:
        self.calls.extend(("destroy_vm", name) for name in names)

    def take(self) -> list[tuple[str, str]]:
        """The calls recorded so far, and forget them."""
        calls, self.calls = self.calls, []
        return calls


@dataclass
class Fleet:
    """Everything a lifecycle function needs; no globals. One per worker process."""

    redis: Redis
    keys: Keys
    config: Config
    store: Store
    providers: Mapping[str, Provider]
    dispatch: Dispatcher
    actor: str
    clone_slots: CloneSemaphore | None = None
    rng: random.Random = field(default_factory=random.SystemRandom)
    names: NameGenerator = field(init=False)

    def __post_init__(self) -> None:
        if self.clone_slots is None:
            self.clone_slots = CloneSemaphore(
                self.redis, self.keys, self.config.ondemand_clone_limit, self.lease_s
            )
        self.names = NameGenerator(self.config.hostname_prefix, self.rng)

    @classmethod
    def build(cls, redis_client: Redis, config: Config, dispatch: Dispatcher, actor: str) -> Fleet:
        keys = Keys(config.key_prefix)
        return cls(
            redis=redis_client,
            keys=keys,
            config=config,
            store=Store(redis_client, keys),
            providers=providers_from_config(redis_client, keys, config),
            dispatch=dispatch,
            actor=actor,
        )

    # -- helpers ------------------------------------------------------------------------
    @property
    def lease_s(self) -> float:
        """How long a clone slot is held without renewal: twice the lock expiry, well
        above the slowest create, so only a dead worker's slot ever times out."""
        return 2.0 * self.config.lock_expire_s

    @property
    def slots(self) -> CloneSemaphore:
        assert self.clone_slots is not None  # set in __post_init__
        return self.clone_slots

    def who(self, job: str) -> str:
        return f"{self.actor}/{job}"

    def lock(self, kind: LockKind, subject: str, job: str) -> FencedLock:
        return FencedLock(
            self.redis,
            self.keys,
            kind,
            subject,
            expire_s=self.config.lock_expire_s,
            holder=self.who(job),
            orphan_fence_ttl_s=self.config.data_ttl_s,
        )

    def provider_for(self, vm: VMRecord) -> Provider | None:
        provider = self.providers.get(vm.provider)
        if provider is None:
            log.error(
                "VM %s names provider %r, which is not configured; leaving it alone",
                vm.name,
                vm.provider,
            )
        return provider

    def pool_timeout_s(self, pool: str) -> float:
        pool_config = self.config.pools.get(pool)
        return pool_config.timeout_s if pool_config is not None else self.config.timeout_s


@contextmanager
def _locked(fleet: Fleet, kind: LockKind, subject: str, job: str) -> Iterator[FencedLock]:
    """A fenced, non-blocking lock for the body; raises LockBusy when taken."""
    lock = fleet.lock(kind, subject, job)
    with lock:
        yield lock


def _note(what: str, subject: str, outcome: Outcome) -> None:
    """Log a transition's outcome: refusals are normal (a race lost), so info, not error."""
    if outcome.ok:
        log.debug("%s %s: %s (v%s)", what, subject, outcome.code, outcome.version)
    else:
        log.info("%s %s refused: %s", what, subject, outcome.code)


def _dispatch_released(fleet: Fleet, *request_ids: str) -> None:
    """Dispatch destroy_vm, in one batch, for every VM of the requests that is on its way
    to destruction (after a request failed or was fulfilled late, its VMs are
    'completed')."""
    released = [
        vm.name
        for request_id in request_ids
        for vm in fleet.store.request_vms(request_id)
        if vm.state == "completed"
    ]
    if released:
        fleet.dispatch.destroy_vms(released)


def _after_vm_failed(fleet: Fleet, vm: VMRecord, outcome: Outcome) -> None:
    """Follow-up of a vm_failed transition: a new reservation on 'retry', destruction
    of what the provider may hold, and of the request's VMs if the request failed."""
    if not outcome.ok:
        return
    fleet.dispatch.destroy_vm(vm.name)
    if outcome.code == "retry":
        fleet.dispatch.provision_request(vm.request_id)
    elif outcome.code == "request_failed":
        _dispatch_released(fleet, vm.request_id)


# ------------------------------------------------------------------------------------
# provision_request: reservations within the clone limit
# ------------------------------------------------------------------------------------


def provision_request(fleet: Fleet, request_id: str) -> list[str]:
    """Reserve VMs for the request's unreserved slots, within the fleet-wide clone limit,
    and dispatch create_vm for each. Returns the names reserved by this call.

    Runs under the request's lock; each reservation passes its fence, so a holder paused
    past its lock's expiry cannot over-reserve (the store refuses 'stale_fence', and
    'slot_full' bounds the slot whatever the lock does). One clone slot is taken per VM
    before it is reserved and handed to create_vm, which gives it back.

    A slot whose pool is no longer in the configuration is skipped with an error in the
    log: no VM exists yet, so there is nothing to fail; the request stays pending and its
    expiry fails it (with the usual TTL reason) unless the pool comes back meanwhile.
    """
    reserved: list[str] = []
    try:
        with _locked(fleet, "request", request_id, "provision") as lock:
            _reserve_for(fleet, request_id, lock, reserved)
    except LockBusy:
        log.debug("provision %s: another worker holds the request", request_id)
    except LockLost as exc:
        log.warning("provision %s stopped: %s", request_id, exc)
    return reserved


def _reserve_for(fleet: Fleet, request_id: str, lock: FencedLock, reserved: list[str]) -> None:
    req = fleet.store.get_request(request_id)
    if req is None or req.status != "pending" or req.unreserved <= 0:
        return
    for slot in req.slots:
        missing = slot.want - slot.live
        if missing <= 0:
            continue
        pool = fleet.config.pools.get(slot.pool)
        if pool is None or pool.provider not in fleet.providers:
            log.error(
                "request %s asks for pool %r, which is not configured (or has no provider);"
                " skipping the slot",
                request_id,
                slot.pool,
            )
            continue
        for _ in range(missing):
            code = _reserve_one(fleet, request_id, slot.alias, pool, lock, reserved)
            if code == "clone_limit" or code in _REQUEST_LEVEL_REFUSALS:
                return
            if code.startswith("request_"):
                return
            if code != "reserved":
                break  # slot_full, no_such_slot, names exhausted: next slot


def _reserve_one(
    fleet: Fleet,
    request_id: str,
    alias: str,
    pool: PoolConfig,
    lock: FencedLock,
    reserved: list[str],
) -> str:
    for _ in range(MAX_NAME_ATTEMPTS):
        name = fleet.names()
        if fleet.slots.acquire(name) is None:
            log.info("provision %s: clone limit reached, the rest waits", request_id)
            return "clone_limit"
        try:
            lock.ensure_held()
            outcome = fleet.store.reserve_vm(
                request_id,
                name=name,
                alias=alias,
                pool=pool.name,
                template=pool.template,
                provider=pool.provider,
                domain=pool.domain,
                actor=fleet.who("provision"),
                fence=lock.fence,
            )
        except BaseException:
            fleet.slots.release(name)
            raise
        _note("reserve", name, outcome)
        if outcome.ok:
            reserved.append(name)
            fleet.dispatch.create_vm(name)
            return "reserved"
        fleet.slots.release(name)
        if outcome.code != "name_taken":
            return outcome.code
    log.warning("provision %s: %d hostnames in a row were taken", request_id, MAX_NAME_ATTEMPTS)
    return "names_exhausted"


# ------------------------------------------------------------------------------------
# create_vm
# ------------------------------------------------------------------------------------


def create_vm(fleet: Fleet, name: str) -> str:
    """Create a reserved VM at its provider and record it pending.

    Returns: 'pending' (created; check_pending_vm dispatched), 'completed' (the request
    let go of the VM while the provider worked: destroyed at the provider at once),
    'retry' / 'request_failed' / 'failed' (the provider refused; vm_failed recorded),
    'busy' (another worker holds the VM), 'throttled' (no clone slot free; the pending
    sweep dispatches it again), 'lock_lost', 'no_provider', or the store's refusal
    ('no_vm', 'vm_<state>', 'stale_fence').

    The create is idempotent at the provider (by name), so a second run, or a run after
    a worker died mid-create, finds the same VM. The clone slot is released in a
    ``finally`` once the create is over, whichever way it went.
    """
    outcome = _under_vm_lock(fleet, name, "reserved", "create", _create_locked)
    if outcome.startswith("vm_"):
        fleet.slots.release(name)  # no longer reserved: whatever slot it held is free
    return outcome


LockedStep = Callable[[Fleet, str, Provider, FencedLock], str]


def _under_vm_lock(fleet: Fleet, name: str, state: str, step: str, body: LockedStep) -> str:
    """The shape of every per-VM job: a cheap read to skip work that is not due, then
    ``body`` under the VM's lock (which re-reads and acts). Another worker holding the
    lock is 'busy', not an error; a lock lost midway stops the step ('lock_lost')."""
    vm = fleet.store.get_vm(name)
    if vm is None:
        return "no_vm"
    if vm.state != state:
        return f"vm_{vm.state}"
    provider = fleet.provider_for(vm)
    if provider is None:
        return "no_provider"
    try:
        with _locked(fleet, "vm", name, step) as lock:
            return body(fleet, name, provider, lock)
    except LockBusy:
        log.debug("%s %s: another worker holds the VM", step, name)
        return "busy"
    except LockLost as exc:
        log.warning("%s %s stopped: %s", step, name, exc)
        return "lock_lost"


def _create_locked(fleet: Fleet, name: str, provider: Provider, lock: FencedLock) -> str:
    vm = fleet.store.get_vm(name)  # re-read under the lock
    if vm is None:
        return "no_vm"
    if vm.state != "reserved":
        fleet.slots.release(name)
        return f"vm_{vm.state}"
    if fleet.slots.acquire(name) is None:  # renews our lease, or takes a free slot
        log.info("create %s: clone limit reached, waiting for a slot", name)
        return "throttled"
    actor = fleet.who("create")
    try:
        lock.ensure_held()
        try:
            provider.create_vm(vm.pool, vm.template, name)
        except Exception as exc:  # any provider failure is recorded, never raised
            permanent = is_permanent_error(exc)
            log.info("create %s failed (permanent=%s): %s", name, permanent, exc)
            lock.ensure_held()
            failed = fleet.store.vm_failed(
                name, f"create failed: {exc}", actor=actor, permanent=permanent, fence=lock.fence
            )
            _note("vm_failed", name, failed)
            _after_vm_failed(fleet, vm, failed)
            if failed.ok:
                return failed.code if failed.code != "completed" else "failed"
            return failed.code
        failpoint("create_vm.after_provider")
        lock.ensure_held()
        failpoint("create_vm.before_commit")  # a pause here is what the fence is for
        created = fleet.store.vm_created(name, actor=actor, fence=lock.fence)
        _note("vm_created", name, created)
        if created.ok and created.code == "pending":
            fleet.dispatch.check_pending_vm(name)
            return "pending"
        if created.code == "stale_fence":
            # Another worker holds the VM now and will finish (or undo) this create; but
            # if the record already let go of the VM, what we made is nobody's.
            _destroy_if_released(fleet, name, provider)
            return "stale_fence"
        # 'completed' (request gone), 'vm_completed' (released meanwhile), ...: the VM we
        # made belongs to nobody; destroy it now rather than wait for the reconciler.
        _destroy_at_provider(fleet, name, provider, lock, pool=vm.pool)
        return "completed" if created.ok else created.code
    finally:
        fleet.slots.release(name)


def _destroy_if_released(fleet: Fleet, name: str, provider: Provider) -> None:
    """Without the lock: destroy at the provider only if the record can never need the
    VM again (completed or destroyed are final), else leave it to the lock holder."""
    vm = fleet.store.get_vm(name)
    if vm is None or vm.state in ("completed", "destroyed"):
        try:
            provider.destroy_vm(vm.pool if vm else "", name)
        except Exception as exc:
            log.warning("destroy of released %s failed (reconcile retries): %s", name, exc)


def _destroy_at_provider(
    fleet: Fleet, name: str, provider: Provider, lock: FencedLock, pool: str = ""
) -> str:
    """Under the VM's lock: destroy at the provider, then record it destroyed. A VM
    whose record is gone (its tombstone expired) is destroyed at the provider only."""
    vm = fleet.store.get_vm(name)
    if vm is None:
        lock.ensure_held()
        try:
            provider.destroy_vm(pool, name)
        except Exception as exc:
            log.warning("destroy of unrecorded %s failed (reconcile retries): %s", name, exc)
        return "no_vm"
    if vm.state != "completed":
        return f"vm_{vm.state}"
    lock.ensure_held()
    try:
        provider.destroy_vm(vm.pool, name)
    except Exception as exc:
        log.warning("destroy %s failed; it stays completed for the next sweep: %s", name, exc)
        return "provider_error"
    lock.ensure_held()
    outcome = fleet.store.vm_destroyed(name, actor=fleet.who("destroy"), fence=lock.fence)
    _note("vm_destroyed", name, outcome)
    return outcome.code


# ------------------------------------------------------------------------------------
# check_pending_vm
# ------------------------------------------------------------------------------------


def check_pending_vm(fleet: Fleet, name: str) -> str:
    """Ask the provider whether a pending VM booted.

    Returns: 'running' / 'fulfilled' (attached; the request turned ready in the same
    step) / 'completed' (the request is gone or out of time: to destruction), 'booting'
    (not yet), 'retry' / 'request_failed' / 'failed' (past the pool's timeout, counted
    from the VM's created_at in server time, or vanished at the provider), 'busy',
    'provider_error', 'lock_lost', 'no_provider', or a refusal ('no_vm', 'vm_<state>').
    """
    return _under_vm_lock(fleet, name, "pending", "check_pending", _check_pending_locked)


def _check_pending_locked(fleet: Fleet, name: str, provider: Provider, lock: FencedLock) -> str:
    vm = fleet.store.get_vm(name)
    if vm is None:
        return "no_vm"
    if vm.state != "pending":
        return f"vm_{vm.state}"
    actor = fleet.who("check_pending")
    reason = ""
    try:
        held = provider.get_vm(vm.pool, name)
        ready = held is not None and provider.vm_ready(vm.pool, name)
    except Exception as exc:
        log.warning("check_pending %s: provider error, next check retries: %s", name, exc)
        return "provider_error"
    if held is None:
        reason = "VM vanished at the provider while booting"
    elif ready:
        lock.ensure_held()
        failpoint("check_pending.before_commit")
        outcome = fleet.store.vm_ready(name, actor=actor, fence=lock.fence)
        _note("vm_ready", name, outcome)
        if outcome.ok and outcome.code == "completed":
            fleet.dispatch.destroy_vm(name)
            _dispatch_released(fleet, vm.request_id)
        return outcome.code
    else:
        timeout_s = fleet.pool_timeout_s(vm.pool)
        since = vm.created_at if vm.created_at is not None else vm.state_since
        if since is None or fleet.store.server_time() - since < timeout_s:
            return "booting"
        reason = f"timeout: not ready {timeout_s:g}s after create"
    lock.ensure_held()
    failed = fleet.store.vm_failed(name, reason, actor=actor, fence=lock.fence)
    _note("vm_failed", name, failed)
    _after_vm_failed(fleet, vm, failed)
    if failed.ok:
        return failed.code if failed.code != "completed" else "failed"
    return failed.code


# ------------------------------------------------------------------------------------
# check_request and the sweeps
# ------------------------------------------------------------------------------------


def check_request(fleet: Fleet, request_id: str) -> str:
    """One request: expire it if its time is up, else push its work along.

    Returns the expiry outcome ('fulfilled' / 'failed'), 'pending' (work dispatched),
    'no_request' or 'request_<status>' for a request that is not pending.
    """
    req = fleet.store.get_request(request_id)
    if req is None:
        return "no_request"
    if req.status != "pending":
        if req.status in ("failed", "deleted"):
            _dispatch_released(fleet, request_id)
        return f"request_{req.status}"
    if fleet.store.server_time() >= req.fail_at:
        outcome = fleet.store.expire_request(request_id, actor=fleet.who("check_request"))
        _note("expire", request_id, outcome)
        if outcome.ok:
            _dispatch_released(fleet, request_id)
        return outcome.code
    vms = fleet.store.get_vms(req.vm_names)
    pending = [vm.name for vm in vms if vm.state == "pending"]
    reserved = [vm.name for vm in vms if vm.state == "reserved"]
    if pending:
        fleet.dispatch.check_pending_vms(pending)
    if reserved:
        fleet.dispatch.create_vms(reserved)
    if req.unreserved > 0:
        fleet.dispatch.provision_request(request_id)
    return "pending"


def sweep_expired(fleet: Fleet, limit: int = 1000) -> dict[str, int]:
    """Expire every request whose time (TTL + grace) is up; count the outcomes.

    The candidates come from one score-range read of the open-request index
    (``store.due_for_expiry``), so the cost follows the number due, not the number open.
    Each candidate then gets its own ``expire_request`` script, deliberately not one
    script for the batch: each expiry is its own atomic unit with its own version bump
    and audit entry on its own request's keys (one ``{rid}`` hash tag per script, as a
    Redis Cluster would require); a long batch script would stall every other client
    for the whole batch; and a script that fails halfway does not roll back, so one bad
    record must not stop or half-apply the others. The script re-checks the deadline and
    readiness inside the unit: a request whose VMs are all attached is fulfilled, never
    failed.
    """
    counts: Counter[str] = Counter()
    actor = fleet.who("sweep")
    expired: list[str] = []
    for request_id in fleet.store.due_for_expiry(limit=limit):
        try:
            outcome = fleet.store.expire_request(request_id, actor=actor)
        except ResponseError as exc:  # one bad record must not stop the sweep
            log.error("expire %s: script error: %s", request_id, exc)
            counts["error"] += 1
            continue
        _note("expire", request_id, outcome)
        counts[outcome.code] += 1
        if outcome.ok:
            expired.append(request_id)
    # Every expiry first, then the destroys in one batch: a request late in a long due
    # list is not kept waiting behind the others' follow-up work (the settle bound).
    _dispatch_released(fleet, *expired)
    return dict(counts)


def provision_sweep(fleet: Fleet) -> int:
    """Dispatch provision_request for every request with unreserved slots (one batch)."""
    candidates = fleet.store.provision_candidates()
    if candidates:
        fleet.dispatch.provision_requests(candidates)
    return len(candidates)


def reserved_grace_s(config: Config) -> float:
    """How long a reservation may wait for its create job before the pending sweep
    dispatches the create again (it is idempotent; a running one answers 'busy')."""
    return max(10.0, 2.0 * config.schedule.check_pending)


def check_pending_sweep(fleet: Fleet, pool: str | None = None) -> int:
    """Dispatch check_pending_vm for every pending VM of every configured pool (or of
    ``pool``), and create_vm again for reservations older than ``reserved_grace_s``
    (a lost create job, or one that found no clone slot). Returns the dispatch count.

    Batched: one read per state for all pools (a pipeline), one dispatch batch per job,
    so the round trips per tick do not grow with the number of pending VMs."""
    now = fleet.store.server_time()
    grace = reserved_grace_s(fleet.config)
    pools = [pool] if pool else list(fleet.config.pools)
    pending = _flat(fleet.store.pools_vms(pools, "pending"))
    stale = _flat(fleet.store.pools_vms(pools, "reserved", max_score=now - grace))
    if pending:
        fleet.dispatch.check_pending_vms(pending)
    if stale:
        fleet.dispatch.create_vms(stale)
    return len(pending) + len(stale)


def _flat(by_pool: Mapping[str, Sequence[str]]) -> list[str]:
    return [name for names in by_pool.values() for name in names]


def reap_running(fleet: Fleet) -> int:
    """End the VMs whose lifetime is over (their running score is their lifetime end)
    and dispatch their destruction. Returns how many were ended.

    Each ``end_vm_lifetime`` is its own atomic transition (one script per expired VM:
    the cost follows the expired count, not the running count); the destroy dispatch
    for all of them is one batch at the end (a pass that dies before it leaves the VMs
    'completed', which destroy_sweep finds)."""
    now = fleet.store.server_time()
    ended: list[str] = []
    for name in _flat(fleet.store.pools_vms(list(fleet.config.pools), "running", max_score=now)):
        outcome = fleet.store.end_vm_lifetime(name, actor=fleet.who("reap"))
        _note("end_vm_lifetime", name, outcome)
        if outcome.ok:
            ended.append(name)
    if ended:
        fleet.dispatch.destroy_vms(ended)
    return len(ended)


def destroy_sweep(fleet: Fleet) -> int:
    """Dispatch destroy_vm for every completed VM of every configured pool (one read
    for all pools, one dispatch batch)."""
    names = _flat(fleet.store.pools_vms(list(fleet.config.pools), "completed"))
    if names:
        fleet.dispatch.destroy_vms(names)
    return len(names)


def destroy_vm(fleet: Fleet, name: str) -> str:
    """Destroy a completed VM at its provider, then record it destroyed.

    Returns 'destroyed', 'provider_error' (a transient failure: the VM stays completed
    and the next destroy sweep retries), 'busy', 'lock_lost', 'no_provider', or a
    refusal ('no_vm', 'vm_<state>': only a completed VM is destroyed).
    """
    return _under_vm_lock(fleet, name, "completed", "destroy", _destroy_at_provider)


# ------------------------------------------------------------------------------------
# reconcile
# ------------------------------------------------------------------------------------


def reconcile(fleet: Fleet) -> dict[str, int]:
    """Provider inventory against the records; finish or undo what a crash left.

    The inventory is read FIRST, then the records (Karpenter's and Nodepool's order): a
    VM is reserved before it is created, so any VM in the inventory already had its
    record when the records are read, and a record missing then is a leak (or a
    tombstone that expired), never an in-flight create. Still, a VM nobody records is
    destroyed only once it is older than ``reconcile_grace_s`` (by the provider's clock).

    - provider VM, record completed -> destroy_vm dispatched; record destroyed (a paused
      creator made it after the destroy) or missing (past the grace) -> destroyed here.
    - reserved VM older than ``2 * lock_expire_s`` whose create job died (its VM lock is
      free): the provider has it -> vm_created; else the request is past its deadline
      (or gone) -> vm_failed; else create_vm dispatched again.
    - pending VM (pending since before the inventory was read) that the provider no
      longer holds -> vm_failed.
    """
    counts: Counter[str] = Counter()
    inventory_started = fleet.store.server_time()
    inventories: dict[str, list[ProviderVM]] = {}
    for provider_name, provider in fleet.providers.items():
        try:
            inventories[provider_name] = provider.inventory()
        except Exception as exc:
            log.warning("reconcile: inventory of %s failed: %s", provider_name, exc)
            counts["inventory_error"] += 1
    now = fleet.store.server_time()

    for provider_name, inventory in inventories.items():
        _reconcile_inventory(
            fleet, provider_name, fleet.providers[provider_name], inventory, now, counts
        )

    held = {(p, vm.name) for p, inv in inventories.items() for vm in inv}
    stuck_before = now - 2.0 * fleet.config.lock_expire_s
    for pool in fleet.config.pools:
        for name in fleet.store.pool_vms(pool, "reserved", max_score=stuck_before):
            _reconcile_reserved(fleet, name, counts)
        for name in fleet.store.pool_vms(pool, "pending", max_score=inventory_started):
            vm = fleet.store.get_vm(name)
            if vm is None or vm.provider not in inventories or (vm.provider, name) in held:
                continue
            _reconcile_lost(fleet, vm, counts)
    return dict(counts)


def _reconcile_inventory(
    fleet: Fleet,
    provider_name: str,
    provider: Provider,
    inventory: list[ProviderVM],
    now: float,
    counts: Counter[str],
) -> None:
    ours = [vm for vm in inventory if VM_NAME_RE.fullmatch(vm.name)]
    for vm in inventory:
        if not VM_NAME_RE.fullmatch(vm.name):
            log.warning(
                "reconcile: %s holds %r, not a vmpool name; left alone", provider.name, vm.name
            )
    records = {r.name: r for r in fleet.store.get_vms(vm.name for vm in ours)}
    for pvm in ours:
        record = records.get(pvm.name)
        if record is None:
            if now - pvm.created_at < fleet.config.reconcile_grace_s:
                counts["unrecorded_in_grace"] += 1
                continue
            _destroy_unowned(fleet, provider, pvm, "leaked", counts)
        elif record.provider != provider_name:
            log.warning(
                "reconcile: %s holds %s, recorded under provider %r; left alone",
                provider_name,
                pvm.name,
                record.provider,
            )
        elif record.state == "completed":
            fleet.dispatch.destroy_vm(pvm.name)
            counts["destroy_dispatched"] += 1
        elif record.state == "destroyed":
            _destroy_unowned(fleet, provider, pvm, "resurrected", counts)


def _destroy_unowned(
    fleet: Fleet, provider: Provider, pvm: ProviderVM, why: str, counts: Counter[str]
) -> None:
    """Destroy a provider VM no live record can claim (missing or destroyed record).
    Under the VM's lock, so it does not race a late create of the same name."""
    try:
        with _locked(fleet, "vm", pvm.name, "reconcile") as lock:
            record = fleet.store.get_vm(pvm.name)
            if record is not None and record.state != "destroyed":
                counts["skipped_recorded"] += 1  # a record appeared: not ours to destroy
                return
            lock.ensure_held()
            provider.destroy_vm(pvm.pool, pvm.name)
            log.info("reconcile: destroyed %s VM %s at %s", why, pvm.name, provider.name)
            counts[f"{why}_destroyed"] += 1
    except LockBusy:
        counts["busy"] += 1
    except LockLost as exc:
        log.warning("reconcile %s stopped: %s", pvm.name, exc)
        counts["lock_lost"] += 1
    except Exception as exc:
        log.warning("reconcile: destroy of %s VM %s failed: %s", why, pvm.name, exc)
        counts["provider_error"] += 1


def _reconcile_reserved(fleet: Fleet, name: str, counts: Counter[str]) -> None:
    vm = fleet.store.get_vm(name)
    if vm is None or vm.state != "reserved":
        return
    provider = fleet.provider_for(vm)
    if provider is None:
        counts["no_provider"] += 1
        return
    redispatch = False
    try:
        with _locked(fleet, "vm", name, "reconcile") as lock:
            redispatch = _finish_reservation(fleet, name, provider, lock, counts)
    except LockBusy:
        counts["busy"] += 1  # a create is running: not abandoned
    except LockLost as exc:
        log.warning("reconcile %s stopped: %s", name, exc)
        counts["lock_lost"] += 1
    except Exception as exc:
        log.warning("reconcile %s: provider error: %s", name, exc)
        counts["provider_error"] += 1
    if redispatch:  # after our lock is released, so the create job can take it
        fleet.dispatch.create_vm(name)


def _finish_reservation(
    fleet: Fleet, name: str, provider: Provider, lock: FencedLock, counts: Counter[str]
) -> bool:
    """Returns True when create_vm should be dispatched again."""
    vm = fleet.store.get_vm(name)
    if vm is None or vm.state != "reserved":
        return False
    actor = fleet.who("reconcile")
    if provider.get_vm(vm.pool, name) is not None:
        lock.ensure_held()
        outcome = fleet.store.vm_created(name, actor=actor, fence=lock.fence)
        _note("vm_created", name, outcome)
        fleet.slots.release(name)
        if outcome.ok and outcome.code == "pending":
            fleet.dispatch.check_pending_vm(name)
            counts["reservation_created"] += 1
        elif outcome.ok or outcome.code == "vm_completed":
            _destroy_at_provider(fleet, name, provider, lock)
            counts["reservation_released"] += 1
        return False
    req = fleet.store.get_request(vm.request_id)
    if req is None or req.status != "pending" or fleet.store.server_time() >= req.deadline:
        lock.ensure_held()
        outcome = fleet.store.vm_failed(
            name, "create abandoned: the creating worker died", actor=actor, fence=lock.fence
        )
        _note("vm_failed", name, outcome)
        fleet.slots.release(name)
        _after_vm_failed(fleet, vm, outcome)
        counts["reservation_failed"] += 1
        return False
    counts["reservation_redispatched"] += 1
    return True


def _reconcile_lost(fleet: Fleet, vm: VMRecord, counts: Counter[str]) -> None:
    provider = fleet.provider_for(vm)
    if provider is None:
        return
    try:
        with _locked(fleet, "vm", vm.name, "reconcile") as lock:
            current = fleet.store.get_vm(vm.name)
            if current is None or current.state != "pending":
                return
            if provider.get_vm(vm.pool, vm.name) is not None:  # re-check, one VM
                return
            lock.ensure_held()
            outcome = fleet.store.vm_failed(
                vm.name,
                "VM vanished at the provider",
                actor=fleet.who("reconcile"),
                fence=lock.fence,
            )
            _note("vm_failed", vm.name, outcome)
            _after_vm_failed(fleet, current, outcome)
            counts["pending_lost"] += 1
    except LockBusy:
        counts["busy"] += 1
    except LockLost as exc:
        log.warning("reconcile %s stopped: %s", vm.name, exc)
        counts["lock_lost"] += 1
    except Exception as exc:
        log.warning("reconcile %s: provider error: %s", vm.name, exc)
        counts["provider_error"] += 1


# For callers that want one entry point per job name (workers/, the CLI).
JOBS: Mapping[str, Callable[..., object]] = {
    "provision_request": provision_request,
    "create_vm": create_vm,
    "check_pending_vm": check_pending_vm,
    "check_request": check_request,
    "sweep_expired": sweep_expired,
    "provision_sweep": provision_sweep,
    "check_pending_sweep": check_pending_sweep,
    "reap_running": reap_running,
    "destroy_sweep": destroy_sweep,
    "destroy_vm": destroy_vm,
    "reconcile": reconcile,
}
