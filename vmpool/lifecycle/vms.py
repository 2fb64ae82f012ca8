"""The VM's side of the lifecycle: create, check while booting, destroy.

``create_vm`` calls the provider for a reserved VM, ``check_pending_vm`` asks whether a
booting VM is ready (or past its timeout), ``destroy_vm`` gives a completed VM back. The
sweeps (``check_pending_sweep``, ``destroy_sweep``) find the VMs that need work; the reap
pass (lifetimes, removed pools) is :mod:`vmpool.lifecycle.reaping`. Provider work runs
under the VM's fenced lock. Every state change is one checked store transition.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from vmpool.ids import Job
from vmpool.lifecycle.cloudsteps import (
    admit,
    circuit_closed,
    create_failed,
    held_back,
    let_go,
)
from vmpool.lifecycle.creating import Made
from vmpool.lifecycle.failpoints import failpoint
from vmpool.lifecycle.fleet import Fleet, note_outcome
from vmpool.lifecycle.locking import run_locked
from vmpool.lifecycle.outcomes import StoreCode, VMCode, VMStep, in_state, store_code
from vmpool.lifecycle.pending import list_lag_s, observe_pending
from vmpool.providers import Provider, ProviderVM, ProviderVMState, StatusBatch, create_for_request
from vmpool.state.durability import settle
from vmpool.state.locks import FencedLock
from vmpool.state.records import Outcome, VMRecord
from vmpool.state.transitions import VM_TO_DESTROY, VMState

__all__ = [
    "check_pending_vm",
    "create_vm",
    "destroy_at_provider",
    "destroy_sweep",
    "destroy_vm",
]

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------
# create_vm
# ------------------------------------------------------------------------------------


def create_vm(
    fleet: Fleet,
    name: str,
    lock: FencedLock | None = None,
    slot: bool | None = None,
    made: Made | None = None,
) -> VMCode:
    """Create a reserved VM at its provider and record it pending.

    Returns one of:

    - 'pending': created, check_pending_vm dispatched.
    - 'completed': the request let go of the VM while the provider worked. The VM was
      destroyed at the provider at once.
    - 'retry' / 'request_failed' / 'failed': the provider refused, vm_failed recorded.
    - 'busy': another worker holds the VM.
    - 'throttled': no clone slot free. The pending sweep dispatches it again.
    - 'circuit_open': the provider's circuit breaker is open. Likewise dispatched again.
    - 'quota': the cloud refused for quota or capacity, now or a moment ago, or the
      provider is at its own max_instances / max_cores. The VM waits reserved, no retry
      spent. Likewise dispatched again.
    - 'lock_lost', 'no_provider'.
    - the store's refusal: 'no_vm', 'vm_<state>', 'stale_fence'.

    The create is idempotent at the provider (by name), so a second run, or a run after
    a worker died mid-create, finds the same VM. The clone slot is given back once the
    create is over, whichever way it went: by ``vm_created`` in its unit, else in a
    ``finally``. ``lock``: the VM's lock,
    granted with its record by a batch job, which releases it (see ``_under_vm_lock``).
    ``slot``: whether the batch job took (or renewed) the VM's clone slot for it (one
    script for its claim), else it is taken here. The slot's lease is held with the
    lock's fencing token, so only this create (or a newer holder of the VM's lock)
    releases it: a creator paused past its lock and lease cannot release the slot of
    the one that took its VM over. A create recorded (``vm_created``) gives the slot
    back in that unit, with the requests whose turn it is then. ``made``: the VM made
    and recorded with the rest of its claim (:mod:`vmpool.lifecycle.creating`); this
    goes on from there.
    """
    body = partial(_create_locked, slot=slot, made=made)

    def not_reserved(lock: FencedLock) -> None:
        give_slot_back(fleet, name, lock.fence)  # no create needs its slot any more

    return _under_vm_lock(fleet, name, VMState.RESERVED, "create", body, lock, not_reserved)


def give_slot_back(fleet: Fleet, name: str, fence: int) -> None:
    """Release VM ``name``'s clone slot (if it is this holder's) and, when one was freed,
    dispatch the provision of the requests first in line for a slot at once: the pending
    sweep would hand it over only at its next tick, one job later, so with a line waiting
    every slot would idle that long and the fleet would serve a line slower than it
    serves requests that find a slot free."""
    turns = fleet.slots.release_to_line(name, fence)
    if turns:
        fleet.dispatch.send(Job.PROVISION_REQUEST, turns)


LockedStep = Callable[[Fleet, VMRecord, Provider, FencedLock], VMCode]


def _under_vm_lock(
    fleet: Fleet,
    name: str,
    state: str | frozenset[VMState],
    step: str,
    body: LockedStep,
    lock: FencedLock | None = None,
    elsewhere: Callable[[FencedLock], None] | None = None,
) -> VMCode:
    """Run ``body`` for a VM in ``state``, under the VM's lock.

    The shape of every per-VM job: the VM's lock, whose grant reads the VM's record in
    the same unit (so the record is read under the lock, once), then ``body`` if the VM
    is in ``state`` (or one of them; else 'vm_<its state>', after ``elsewhere(lock)``). ``lock``:
    already granted that way (a batch job grants the locks of its claim in one script
    and releases them in one). Else taken and released here. Another worker holding the
    lock is 'busy', not an error. A lock lost midway stops the step ('lock_lost')."""

    def run(held: FencedLock) -> VMCode:
        vm = VMRecord.from_hash(held.record) if held.record else None
        if vm is None:
            return VMStep.NO_VM
        if vm.state not in (state if isinstance(state, frozenset) else {state}):
            if elsewhere is not None:
                elsewhere(held)
            return in_state("vm", vm.state)
        provider = fleet.provider_for(vm)
        if provider is None:
            return VMStep.NO_PROVIDER
        return body(fleet, vm, provider, held)

    return run_locked(fleet, "vm", name, step, run, lock=lock, read_record=True)


def _create_locked(
    fleet: Fleet,
    vm: VMRecord,
    provider: Provider,
    lock: FencedLock,
    slot: bool | None = None,
    made: Made | None = None,
) -> VMCode:
    name = vm.name
    if made is None:
        hold = held_back(fleet, provider, vm)
        if hold:
            give_slot_back(fleet, name, lock.fence)  # the VM waits reserved, holding no slot
            return VMStep(hold)
        if slot is None:  # renews (or takes over) the VM's lease, or takes a free slot
            slot = fleet.slots.acquire(name, lock.fence) is not None
        if not slot:
            log.info("create %s: clone limit reached, waiting for a slot", name)
            return VMStep.THROTTLED
    created: Outcome | None = None
    try:
        answer = made.answer if made else _create_at_provider(fleet, provider, vm, lock)
        if isinstance(answer, str):
            return answer  # the provider's own limits: the VM waits
        if isinstance(answer, Exception):  # any provider failure is recorded, never raised
            return create_failed(fleet, provider, vm, lock, answer)
        circuit_closed(fleet, provider, vm)
        created = _record_created(fleet, vm, lock, made)
        return _after_created(fleet, vm, provider, lock, created)
    finally:
        if created is None or not created.ok:  # else vm_created gave it back
            give_slot_back(fleet, name, lock.fence)  # ours only: not a newer creator's
        let_go(fleet, provider, vm)


def _create_at_provider(
    fleet: Fleet, provider: Provider, vm: VMRecord, lock: FencedLock
) -> ProviderVM | Exception | VMStep | StoreCode:
    """The provider's create of ``vm`` (its error in place), or why it must wait."""
    lock.ensure_held()  # before the provider call: a side effect no fence guards
    refused = admit(fleet, provider, vm, lock)  # the provider's own limits
    if refused:
        return refused
    try:
        with fleet.slots.renewing(vm.name, lock.fence):  # held as long as the call runs
            made = create_for_request(provider, vm.pool, vm.template, vm.name, vm.request_id)
    except Exception as exc:
        return exc
    failpoint("create_vm.after_provider")
    return made


def _record_created(fleet: Fleet, vm: VMRecord, lock: FencedLock, made: Made | None) -> Outcome:
    """``vm_created`` (run with its claim's when ``made``), which gives the VM's clone slot
    back in its unit; the requests whose turn for a slot it is then get their provision
    dispatched at once."""
    if made is None:
        # No ensure_held() before the write: its fence refuses a stale holder inside it.
        failpoint("create_vm.before_commit")  # a pause here is what the fence is for
        created: Outcome | Exception | None = fleet.store.vm_created(
            vm.name,
            actor=fleet.who("create"),
            fence=lock.fence,
            request_id=vm.request_id,
            slot_limit=fleet.slots.limit,
        )
    else:
        created = made.created
    if not isinstance(created, Outcome):
        raise created or RuntimeError(f"create {vm.name}: made, and no record of it")
    note_outcome("vm_created", vm.name, created)
    if created.turns:
        fleet.dispatch.send(Job.PROVISION_REQUEST, list(created.turns))
    return created


def _after_created(
    fleet: Fleet, vm: VMRecord, provider: Provider, lock: FencedLock, created: Outcome
) -> VMCode:
    """What follows ``vm_created``'s outcome: the VM's check, or its destruction."""
    name = vm.name
    if created.ok and created.code == "pending":
        fleet.dispatch.send(Job.CHECK_PENDING_VM, [name])
        return VMStep.PENDING
    if created.code == "stale_fence":
        # Another worker holds the VM now and will finish (or undo) this create. But
        # if the record already let go of the VM, what we made is nobody's.
        _destroy_if_released(fleet, name, provider)
        return VMStep.STALE_FENCE
    # 'completed' (request gone), 'vm_completed' (released meanwhile), ...: the VM we
    # made belongs to nobody. Destroy it now rather than wait for the reconciler.
    destroy_at_provider(fleet, name, provider, lock, pool=vm.pool)
    return VMStep.COMPLETED if created.ok else store_code(created)


def _destroy_if_released(fleet: Fleet, name: str, provider: Provider) -> None:
    """Destroy a VM nobody can need, without its lock.

    Without the lock: destroy at the provider only if the record can never need the VM
    again (completed or destroyed are final), else leave it to the lock holder."""
    vm = fleet.store.get_vm(name)
    if vm is None or vm.state in (VMState.COMPLETED, VMState.DESTROYED):
        settle(fleet.redis)  # the job's writes confirmed before the side effect
        try:
            provider.destroy_vm(vm.pool if vm else "", name)
        except Exception as exc:
            log.warning("destroy of released %s failed (reconcile retries): %s", name, exc)


def destroy_at_provider(
    fleet: Fleet, name: str, provider: Provider, lock: FencedLock, pool: str = ""
) -> VMCode:
    """Destroy a VM at its provider, then record it destroyed.

    Runs under the VM's lock. A VM whose record is gone (its tombstone expired) is
    destroyed at the provider only."""
    vm = fleet.store.get_vm(name)
    if vm is None:
        lock.ensure_held()
        try:
            provider.destroy_vm(pool, name)
        except Exception as exc:
            log.warning("destroy of unrecorded %s failed (reconcile retries): %s", name, exc)
        return VMStep.NO_VM
    if not _to_destroy_now(fleet, vm):
        return in_state("vm", vm.state)
    lock.ensure_held()
    try:
        provider.destroy_vm(vm.pool, name)
    except Exception as exc:
        log.warning("destroy %s failed; it stays completed for the next sweep: %s", name, exc)
        return VMStep.PROVIDER_ERROR
    outcome = fleet.store.vm_destroyed(name, actor=fleet.who("destroy"), fence=lock.fence)
    note_outcome("vm_destroyed", name, outcome)
    return store_code(outcome)


def _to_destroy_now(fleet: Fleet, vm: VMRecord) -> bool:
    """Whether ``vm`` (read under its lock) is destroyed now: completed, or on hold with
    its hold over (server time). A hold is set once, when the VM fails, and never moves."""
    if vm.state == VMState.ON_HOLD:
        return vm.hold_until is not None and vm.hold_until <= fleet.store.server_time()
    return vm.state == VMState.COMPLETED


# ------------------------------------------------------------------------------------
# check_pending_vm
# ------------------------------------------------------------------------------------


def check_pending_vm(
    fleet: Fleet,
    name: str,
    lock: FencedLock | None = None,
    seen: Mapping[str, Mapping[str, ProviderVM | None]] | None = None,
    readied: VMCode | None = None,
) -> VMCode:
    """Ask the provider whether a pending VM booted.

    Returns: 'running' / 'fulfilled' (attached, and the request turned ready in the same
    step) / 'completed' (the request is gone or out of time: to destruction), 'booting'
    (not yet), 'retry' / 'request_failed' / 'failed' (past the pool's timeout, counted
    from the VM's created_at in server time, or vanished at the provider), 'busy',
    'provider_error', 'lock_lost', 'no_provider', or a refusal ('no_vm', 'vm_<state>').
    ``lock``: as for :func:`create_vm`. ``seen``: per provider, its answer for a batch of
    VMs asked at once after their locks were granted (a batch job's claim): not asked
    again. ``readied``: the code of the ready transition that claim recorded for the VM
    under ``lock`` (record_ready_all)."""
    if readied is not None and lock is not None:
        return readied
    body = partial(_check_pending_locked, seen=seen or {})
    return _under_vm_lock(fleet, name, VMState.PENDING, "check_pending", body, lock)


def _check_pending_locked(
    fleet: Fleet,
    vm: VMRecord,
    provider: Provider,
    lock: FencedLock,
    seen: Mapping[str, Mapping[str, ProviderVM | None]],
) -> VMCode:
    name = vm.name
    answers = seen.get(vm.provider)
    try:
        if isinstance(provider, StatusBatch):  # one cloud call, not two
            if answers is None or name not in answers:
                answers = provider.statuses([name])
            held = answers.get(name)
            ready = held is not None and held.state == ProviderVMState.RUNNING
        else:
            held = provider.get_vm(vm.pool, name)
            ready = held is not None and provider.is_ready(vm.pool, name)
    except Exception as exc:
        log.warning("check_pending %s: provider error, next check retries: %s", name, exc)
        return VMStep.PROVIDER_ERROR
    return observe_pending(fleet, vm, lock, held, ready, lag_s=list_lag_s(provider))


def _flat(by_pool: Mapping[str, Sequence[str]]) -> list[str]:
    return [name for names in by_pool.values() for name in names]


def destroy_sweep(fleet: Fleet) -> int:
    """Dispatch destroy_vm for every completed VM, and every VM whose hold is over.

    One read for all configured pools (an on-hold VM's index score is its hold's end),
    one dispatch batch."""
    pools = list(fleet.config.pools)
    now = fleet.store.server_time()
    names = _flat(fleet.store.pools_vms(pools, VMState.COMPLETED))
    names += _flat(fleet.store.pools_vms(pools, VMState.ON_HOLD, max_score=now))
    if names:
        fleet.dispatch.send(Job.DESTROY_VM, names)
    return len(names)


def destroy_vm(fleet: Fleet, name: str) -> VMCode:
    """Destroy a completed VM at its provider, then record it destroyed.

    Returns 'destroyed', 'provider_error' (a transient failure: the VM stays completed
    and the next destroy sweep retries), 'busy', 'lock_lost', 'no_provider', or a
    refusal ('no_vm', 'vm_<state>': only a completed VM is destroyed, or one on hold
    once its hold is over: 'vm_on_hold' before).
    """
    return _under_vm_lock(fleet, name, VM_TO_DESTROY, "destroy", _destroy_locked)


def _destroy_locked(fleet: Fleet, vm: VMRecord, provider: Provider, lock: FencedLock) -> VMCode:
    return destroy_at_provider(fleet, vm.name, provider, lock, pool=vm.pool)
