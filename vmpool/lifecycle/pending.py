"""What a booting VM's check records, and the batched check of the cloud providers.

``observe_pending`` turns one answer of the cloud (the VM as it holds it, or nothing)
into the VM's next state:

- ``vm_ready``, with the cloud's address as hostname when the pool has no domain
- ``vm_failed`` when it vanished, when the cloud says it never will boot (an instance
  in ERROR, stopped: at once, with the cloud's words), or when it is past its pool's
  timeout
- nothing while it boots.

Both paths use it: ``check_pending_vm`` (one VM, one question) and ``check_batched``.
The pending sweep runs ``check_batched`` for providers that answer for many VMs at once
(:class:`~vmpool.providers.StatusBatch`). That is one list call per provider per sweep
for every pending VM, never one cloud call per VM per tick. Only the VMs whose
answer changes something take their lock, granted and released as a batch job's claim
(one script each for :data:`LOCKS_AT_ONCE` VMs). Every change is the same fenced
transition as in ``check_pending_vm``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vmpool.config import Config
from vmpool.ids import VM_NAME_RE, Job
from vmpool.lifecycle.cloudsteps import creates_due
from vmpool.lifecycle.failures import boot_failed_noted
from vmpool.lifecycle.fleet import Fleet, after_vm_failed, note_outcome
from vmpool.lifecycle.locking import LockMiss, run_locked
from vmpool.lifecycle.outcomes import VMCode, VMStep, in_state, store_code
from vmpool.lifecycle.ready import ReadyVM, ready_now, record_ready, record_ready_all
from vmpool.providers import ProviderVM, ProviderVMState, StatusBatch
from vmpool.state.locks import FencedLock, acquire_all, release_all
from vmpool.state.records import VMRecord
from vmpool.state.transitions import VMState
from vmpool.state.workset import WorkSet

__all__ = [
    "REDISPATCHED",
    "Answers",
    "Booting",
    "Listing",
    "apply_listing",
    "check_batched",
    "check_pending_sweep",
    "list_lag_s",
    "list_pending",
    "observe_pending",
    "reserved_grace_s",
]

log = logging.getLogger(__name__)

# The locks of the VMs one sweep acts on, granted (and released) in one script each so
# many: a claim's size in the batch jobs.
LOCKS_AT_ONCE = 20


def list_lag_s(provider: object) -> float:
    """How long after its create a VM missing from ``provider``'s list may only be lagging.

    The provider's :attr:`~vmpool.providers.StatusBatch.list_lag_s`. 0 for a provider
    asked VM by VM (its answer is the truth). The per-VM check and the reconciler do not
    use it."""
    if not isinstance(provider, StatusBatch):
        return 0.0
    return float(provider.list_lag_s)


def observe_pending(
    fleet: Fleet,
    vm: VMRecord,
    lock: FencedLock,
    held: ProviderVM | None,
    ready: bool,
    *,
    lag_s: float = 0.0,
) -> VMCode:
    """Record what the cloud said of pending ``vm`` (re-read under ``lock``).

    ``lag_s``: the answer came from a list that may lag a create by that long
    (:func:`list_lag_s`), so a VM missing from it is booting until it is that old.

    Returns the store's code ('running', 'fulfilled', 'completed', 'retry',
    'request_failed', 'failed', or a refusal) or 'booting' when nothing changed."""
    name = vm.name
    actor = fleet.who("check_pending")
    if held is None and lag_s > 0 and _age(vm, fleet.store.server_time()) < lag_s:
        return VMStep.BOOTING
    if held is None:
        reason = "VM vanished at the provider while booting"
    elif held.state == ProviderVMState.FAILED:
        reason = f"failed at the provider: {held.error or 'no reason given'}"
    elif ready:
        return record_ready(fleet, vm, lock, held)
    else:
        timeout_s = fleet.pool_timeout_s(vm.pool)
        since = vm.created_at if vm.created_at is not None else vm.state_since
        if since is None or fleet.store.server_time() - since < timeout_s:
            return VMStep.BOOTING
        reason = f"timeout: not ready {timeout_s:g}s after create"
    # a VM the provider holds failed its ready check: kept on hold when its pool says so
    hold_s = 0.0 if held is None else _hold_s(fleet, vm.pool)
    failed = fleet.store.vm_failed(
        name, reason, actor=actor, fence=lock.fence, request_id=vm.request_id, hold_s=hold_s
    )
    note_outcome("vm_failed", name, failed)
    if failed.ok:
        boot_failed_noted(fleet, vm, reason)
    after_vm_failed(fleet, vm, failed)  # its destroy job waits out a hold (vms.py)
    if failed.ok and failed.code in (VMState.COMPLETED, VMState.ON_HOLD):
        return VMStep.FAILED
    return store_code(failed)


def _hold_s(fleet: Fleet, pool: str) -> float:
    """How long a VM of ``pool`` that failed its ready check is kept on hold."""
    pool_config = fleet.config.pools.get(pool)
    return pool_config.hold_failed_s if pool_config is not None else 0.0


@dataclass(frozen=True)
class Booting:
    """A pool's pending VMs as its index holds them, oldest first.

    ``lagged`` / ``timed_out``: how many of the first went pending at least the list lag
    of the pool's provider / the pool's timeout before the listing's ``now`` (the
    index's score stands in for the record's created_at; the record decides under the
    lock). It is all the pending sweep reads of them before a cloud answer is due:
    names, no object per VM."""

    pool: str
    names: list[str]
    lagged: int
    timed_out: int


# A provider's one answer for many VMs: each as the cloud holds it, or None.
Answers = Mapping[str, ProviderVM | None]


@dataclass(frozen=True)
class Listing:
    """What the pending sweep read before it acts.

    Per batching provider, the booting VMs of its pools (from the pending index) and its
    one answer for them, at server time ``now``. Also the VMs left for per-VM checks
    (``rest``). Acting on it later, when some of it is stale, is safe: each VM's record
    decides under its lock."""

    now: float
    answers: dict[str, tuple[list[Booting], Answers]] = field(default_factory=dict)
    rest: list[str] = field(default_factory=list)


def check_batched(fleet: Fleet, pools: Sequence[str], now: float | None = None) -> list[str]:
    """Check the pending VMs of providers that answer for many at once.

    Check the pending VMs of ``pools`` whose pool's provider answers for many at once
    (:class:`~vmpool.providers.StatusBatch`): one index read for all pools, one list
    call per provider, and a lock only for a VM whose answer changes something (up,
    vanished past the provider's list lag, or past its pool's timeout). Returns the
    names left for per-VM checks: those of providers that do not batch, and any VM whose
    record names another provider than its pool's (checked by its own). ``now``: the
    server time the sweep read, else read here.

    So a booting VM costs the sweep its share of the index read and of the list call
    (the simulated cloud: its share of one server-side read), not a job, a lock and a
    record read per tick: that is what makes a short ``check_pending_sweep`` cheap
    (docs/benchmarks.md). :func:`list_pending` is the read, :func:`apply_listing` the
    acting on it."""
    rest, _ = apply_listing(fleet, list_pending(fleet, pools, now))
    return rest


def list_pending(fleet: Fleet, pools: Sequence[str], now: float | None = None) -> Listing:
    """The read half of :func:`check_batched`.

    The pending index (names, and how many are past each age that matters) and one list
    call per batching provider (a provider that fails to answer is left for the next
    sweep). ``now``: as for :func:`check_batched`."""
    batching = {pool: _batching_provider(fleet, pool) for pool in dict.fromkeys(pools)}
    ages = {
        pool: [list_lag_s(fleet.providers[name]), fleet.pool_timeout_s(pool)] if name else []
        for pool, name in batching.items()
    }
    if now is None:
        now = fleet.store.server_time() if any(batching.values()) else 0.0
    listing = Listing(now)
    booting: dict[str, list[Booting]] = {}
    for pool, (names, older) in fleet.store.pools_vms_aged(VMState.PENDING, ages, now).items():
        provider_name = batching[pool]
        if not provider_name:
            listing.rest.extend(names)
            continue
        lagged, timed_out = older
        group = _named(Booting(pool, names, lagged, timed_out), listing.rest)
        if group.names:
            booting.setdefault(provider_name, []).append(group)
    for provider_name, groups in booting.items():
        provider = fleet.providers[provider_name]
        assert isinstance(provider, StatusBatch)
        names = groups[0].names if len(groups) == 1 else [n for g in groups for n in g.names]
        try:
            listing.answers[provider_name] = (groups, provider.statuses(names))
        except Exception as exc:
            log.warning("check_pending: %s did not answer: %s", provider_name, exc)
    return listing


def _batching_provider(fleet: Fleet, pool: str) -> str:
    """The name of ``pool``'s provider if it answers for many VMs at once, else ''."""
    pool_config = fleet.config.pools.get(pool)
    name = pool_config.provider if pool_config is not None else ""
    return name if isinstance(fleet.providers.get(name), StatusBatch) else ""


def _named(group: Booting, rest: list[str]) -> Booting:
    """``group`` without the entries that are no VM name (added to ``rest``).

    The dispatcher skips, logs and counts them, as for every sweep. One pass at C speed
    when all are names (the rule of :func:`~vmpool.ids.validate_vm_name`)."""
    if all(map(VM_NAME_RE.fullmatch, group.names)):
        return group
    keep = [VM_NAME_RE.fullmatch(name) is not None for name in group.names]
    rest.extend(name for name, ok in zip(group.names, keep, strict=True) if not ok)
    return Booting(
        group.pool,
        [name for name, ok in zip(group.names, keep, strict=True) if ok],
        sum(keep[: group.lagged]),
        sum(keep[: group.timed_out]),
    )


def apply_listing(fleet: Fleet, listing: Listing) -> tuple[list[str], dict[str, str]]:
    """The acting half of :func:`check_batched`.

    For the VMs whose answer changes something: their locks granted in one script per
    :data:`LOCKS_AT_ONCE` (each grant reads the VM's record), each VM's fenced
    transition, and the locks released in one script. A VM whose lock another worker
    holds is ``busy``: the next sweep sees it again. Returns the names left for per-VM
    checks and each acted-on VM's outcome."""
    rest = list(listing.rest)
    due: list[tuple[str, str, ProviderVM | None, float]] = []
    for provider_name, (booting, seen) in listing.answers.items():
        lag = list_lag_s(fleet.providers[provider_name])
        due += [(name, provider_name, held, lag) for group in booting
                for name, held in _due(group, seen)]  # fmt: skip
    outcomes: dict[str, str] = {}
    for at in range(0, len(due), LOCKS_AT_ONCE):
        part = due[at : at + LOCKS_AT_ONCE]
        asked = [fleet.lock("vm", name, "check_pending", read_record=True) for name, *_ in part]
        granted = {lock.subject: lock for lock in acquire_all(asked)}
        try:
            booted: list[ReadyVM] = []
            for name, provider_name, held, lag in part:
                lock = granted.get(name)
                if lock is not None and (ready := ready_now(lock, provider_name, held)):
                    booted.append(ready)  # recorded below, with the others, in one call
                    continue
                outcome = (
                    _observe_locked(fleet, name, provider_name, held, lag, lock)
                    if lock is not None
                    else LockMiss.BUSY
                )
                outcomes[name] = outcome
                if outcome == VMStep.OTHER_PROVIDER:
                    rest.append(name)
            outcomes.update(record_ready_all(fleet, booted))
        finally:
            release_all(list(granted.values()))
    return rest, outcomes


def _age(vm: VMRecord, now: float) -> float:
    since = vm.created_at if vm.created_at is not None else vm.state_since
    return now - since if since is not None else 0.0


# The answers that change a booting VM whatever its age.
_ACTED_ON = frozenset({ProviderVMState.RUNNING, ProviderVMState.FAILED})


def _due(group: Booting, seen: Answers) -> list[tuple[str, ProviderVM | None]]:
    """The VMs of ``group`` whose answer in ``seen`` changes anything, with it.

    Those whose lock is worth taking: up or failed at the cloud, missing from the list
    past the provider's list lag, past the pool's timeout with an answer. Past an age is
    a prefix of the names (oldest first), so each stretch is one pass with one test."""
    names = group.names
    lo, hi = sorted((group.lagged, group.timed_out))
    due = [(name, seen.get(name)) for name in names[:lo]]  # past both: any answer, or none
    missing_due = group.lagged > group.timed_out  # past one: the lag (missing) or timeout
    due += [
        (name, held)
        for name in names[lo:hi]
        if ((held := seen.get(name)) is None) == missing_due
        or (held is not None and held.state in _ACTED_ON)
    ]
    due += [
        (name, held)
        for name in names[hi:]
        if (held := seen.get(name)) is not None and held.state in _ACTED_ON
    ]
    return due


def _observe_locked(
    fleet: Fleet,
    name: str,
    provider_name: str,
    held: ProviderVM | None,
    lag: float,
    lock: FencedLock,
) -> VMCode:
    """Record the cloud's answer for one VM under its lock (granted, with its record).

    The cloud's answer recorded if the VM is still pending at ``provider_name``."""

    def step(lock: FencedLock) -> VMCode:
        vm = VMRecord.from_hash(lock.record) if lock.record else None
        if vm is None:
            return VMStep.NO_VM
        if vm.state != VMState.PENDING:
            return in_state("vm", vm.state)
        if vm.provider != provider_name:  # the pool changed provider since its create
            return VMStep.OTHER_PROVIDER
        ready = held is not None and held.state == ProviderVMState.RUNNING
        return observe_pending(fleet, vm, lock, held, ready, lag_s=lag)

    return run_locked(fleet, "vm", name, "check_pending", step, lock=lock, read_record=True)


def reserved_grace_s(config: Config) -> float:
    """How long a reservation may wait for its create job.

    Then the pending sweep dispatches the create again (it is idempotent, and a running one
    answers 'busy')."""
    return max(10.0, 2.0 * config.schedule.check_pending_sweep)


def check_pending_sweep(fleet: Fleet, pool: str | None = None) -> int:
    """Dispatch the checks and creates the booting and reserved VMs need.

    Dispatch check_pending_vm for every pending VM of every configured pool (or of
    ``pool``), and create_vm again for reservations older than ``reserved_grace_s`` (a
    lost create job, or one that found no clone slot). Returns the dispatch count.

    Batched: one read per state for all pools (a pipeline), one dispatch batch per job,
    so the round trips per tick do not grow with the number of pending VMs. The VMs of
    a provider that answers for many at once (the clouds) are checked here instead,
    one list call per provider (``pending.check_batched``). Work-set subjects due back
    in line (deferred, or claimed by a worker that died) are dispatched again too (one
    read), so a batch job is queued for them within a tick, and so are the requests
    waiting for a clone slot whose turn has come (one script: a slot freed goes to the
    first in line within a tick)."""
    now = fleet.store.server_time()
    grace = reserved_grace_s(fleet.config)
    pools = [pool] if pool else list(fleet.config.pools)
    stale = creates_due(
        fleet, fleet.store.pools_vms(pools, VMState.RESERVED, max_score=now - grace)
    )
    pending = check_batched(fleet, pools, now)  # a batching provider's VMs: checked here
    # work-set subjects back in line (a deferral over, a dead claimer's lease ended):
    # dispatched again, which queues a batch job for them (they are in the set once)
    due = WorkSet(fleet.redis, fleet.keys).lapsed(REDISPATCHED, now) if pool is None else {}
    pending = list(dict.fromkeys([*pending, *due.get(Job.CHECK_PENDING_VM, [])]))
    stale = list(dict.fromkeys([*stale, *due.get(Job.CREATE_VM, [])]))
    if pending:
        fleet.dispatch.send(Job.CHECK_PENDING_VM, pending)
    if stale:
        fleet.dispatch.send(Job.CREATE_VM, stale)
    requests = due.get(Job.PROVISION_REQUEST, [])
    if pool is None:  # a clone slot free goes to the request first in line waiting for one
        requests = list(dict.fromkeys([*requests, *fleet.slots.turns()]))
    if requests:
        fleet.dispatch.send(Job.PROVISION_REQUEST, requests)
    return len(pending) + len(stale) + len(requests)


# The work sets whose subjects the pending sweep dispatches again once they are due
# (also what the scheduler checks before it runs it: vmpool/lifecycle/idle.py).
REDISPATCHED = (Job.CREATE_VM, Job.CHECK_PENDING_VM, Job.PROVISION_REQUEST)
