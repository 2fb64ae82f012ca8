"""A booted VM recorded ready: alone, or many of a claim or a sweep in one store call.

The pending checks (:mod:`vmpool.lifecycle.pending`: the sweep's listing, a check
claim's one status call, a VM's own check) end here when the cloud says a VM booted.
:func:`record_ready` is one VM's ``vm_ready``. :func:`record_ready_all` records the
booted VMs of requests that one claim or one sweep holds locked in one script
(:meth:`~vmpool.state.store.Store.vms_ready`): one round trip, one server TIME and one
operation id for all, where one call each would pay its own; each VM is still checked
on its own (its record, its request, its lock's fencing token). :func:`ready_now` picks
them: a VM still pending at the provider that answered, of a request (a warm-pool VM's
transition is another script), its answer ``running``.
"""

from __future__ import annotations

from collections.abc import Sequence

from vmpool.ids import Job
from vmpool.lifecycle.failpoints import failpoint
from vmpool.lifecycle.fleet import Fleet, dispatch_released, note_outcome
from vmpool.lifecycle.outcomes import VMCode, store_code
from vmpool.providers import ProviderVM, ProviderVMState
from vmpool.state.locks import FencedLock
from vmpool.state.records import Booted, Outcome, VMRecord
from vmpool.state.transitions import VMState

__all__ = ["ReadyVM", "ready_now", "record_ready", "record_ready_all"]

# A booted VM of a request as read under its lock, with the cloud's answer for it.
ReadyVM = tuple[VMRecord, FencedLock, ProviderVM]


def ready_now(lock: FencedLock, provider: str, held: ProviderVM | None) -> ReadyVM | None:
    """The VM of ``lock`` for :func:`record_ready_all`, if ``held`` says it booted.

    Its record as its lock's grant read it: pending at ``provider`` (the one that gave
    the answer ``held``) and a VM of a request. Else None: its own check decides."""
    if held is None or held.state != ProviderVMState.RUNNING or not lock.record:
        return None
    vm = VMRecord.from_hash(lock.record)
    if vm.state != VMState.PENDING or vm.provider != provider or not vm.request_id:
        return None
    return vm, lock, held


def record_ready(fleet: Fleet, vm: VMRecord, lock: FencedLock, held: ProviderVM) -> VMCode:
    """Record a booted VM ready: attached to its request, or to destruction when the
    request is gone. The store's code."""
    # No lock check before the write: the store's fence refuses a stale holder
    # ('stale_fence'), which is the guarantee. A check here is a round trip per VM.
    failpoint("check_pending.before_commit")
    outcome = fleet.store.vm_ready(
        vm.name,
        actor=fleet.who("check_pending"),
        fence=lock.fence,
        hostname=_hostname(vm, held),
        request_id=vm.request_id,
        address=held.address,
    )
    return _after_ready(fleet, vm, outcome)


def record_ready_all(fleet: Fleet, booted: Sequence[ReadyVM]) -> dict[str, VMCode]:
    """Record booted VMs of requests ready, each under its lock, in one store call.

    What :func:`record_ready` does for each, with one script for all
    (:meth:`~vmpool.state.store.Store.vms_ready`: one round trip, one TIME, one operation
    id). Each VM's code by name."""
    if not booted:
        return {}
    for _ in booted:
        failpoint("check_pending.before_commit")
    outcomes = fleet.store.vms_ready(
        [Booted(vm.name, vm.request_id, lock.fence, _hostname(vm, held), held.address)
         for vm, lock, held in booted],
        actor=fleet.who("check_pending"),
    )  # fmt: skip
    return {
        vm.name: _after_ready(fleet, vm, outcome)
        for (vm, _, _), outcome in zip(booted, outcomes, strict=True)
    }


def _after_ready(fleet: Fleet, vm: VMRecord, outcome: Outcome) -> VMCode:
    """What follows a VM's ready transition: a VM sent to destruction is destroyed."""
    note_outcome("vm_ready", vm.name, outcome)
    if outcome.ok and outcome.code == "completed":
        fleet.dispatch.send(Job.DESTROY_VM, [vm.name])
        dispatch_released(fleet, vm.request_id)
    return store_code(outcome)


def _hostname(vm: VMRecord, held: ProviderVM) -> str:
    """The hostname to record for a VM the cloud booted.

    The cloud's address when the pool has no domain (the record's hostname is then the
    bare name). '' keeps ``<name>.<domain>``."""
    address = held.address or (held.hostname if held.hostname != vm.name else "")
    if vm.hostname == vm.name and address:
        return address
    return ""
