"""``reconcile``: the provider's inventory held against the records.

Finds what no job will: VMs the provider holds that no record owns (leaks, destroyed
after a grace), reservations whose creator died (finished or cleaned up), and records
whose VM the provider lost (failed when booting, ended when handed out, as vmpooler moves
it to completed). The inventory is one list call per provider and runs no ready check.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Literal

from vmpool.ids import VM_NAME_RE, Job
from vmpool.lifecycle.fleet import Fleet, after_vm_failed, note_outcome
from vmpool.lifecycle.locking import run_locked
from vmpool.lifecycle.outcomes import LockMiss, ReconcileCount
from vmpool.lifecycle.vms import destroy_at_provider
from vmpool.providers import Provider, ProviderVM
from vmpool.state.locks import FencedLock
from vmpool.state.records import VMRecord
from vmpool.state.transitions import RequestStatus, VMState

__all__ = ["reconcile"]

log = logging.getLogger(__name__)

# What a reconcile pass counts, by outcome.
Counts = Counter[ReconcileCount | LockMiss]

# Why a provider VM no live record can claim is destroyed.
Unowned = Literal["leaked", "resurrected"]

# ------------------------------------------------------------------------------------
# reconcile
# ------------------------------------------------------------------------------------


def reconcile(fleet: Fleet) -> dict[str, int]:
    """Provider inventory against the records. Finish or undo what a crash left.

    The inventory is read FIRST, then the records (Karpenter's and Nodepool's order): a
    VM is reserved before it is created, so any VM in the inventory already had its
    record when the records are read, and a record missing then is a leak (or a
    tombstone that expired), never an in-flight create. Still, a VM nobody records is
    destroyed only once it is older than ``reconcile_grace_s`` (by the provider's clock).

    - provider VM, record completed -> destroy_vm dispatched. Record destroyed (a paused
      creator made it after the destroy) or missing (past the grace) -> destroyed here,
      unless unowned or the fleet has a lost mark (vmpool/state/fleet_identity.py).
    - reserved VM older than ``2 * lock_expire_s`` whose create job died (its VM lock is
      free): the provider has it -> vm_created. Else the request is past its deadline
      (or gone) -> vm_failed. Else create_vm dispatched again.
    - pending VM (pending since before the inventory was read) that the provider no
      longer holds -> vm_failed.
    - running VM (handed out before the inventory was read) that the provider no longer
      holds -> ended ('vanished at the provider'), its request left as it is.
    """
    counts: Counts = Counter()
    keep_unrecorded = bool(fleet.identity.marks().lost)  # before the inventory: noticed
    inventory_started = fleet.store.server_time()
    inventories: dict[str, list[ProviderVM]] = {}
    for provider_name, provider in fleet.providers.items():
        try:
            inventories[provider_name] = provider.inventory()
        except Exception as exc:
            log.warning("reconcile: inventory of %s failed: %s", provider_name, exc)
            counts[ReconcileCount.INVENTORY_ERROR] += 1
    now = fleet.store.server_time()

    for provider_name, inventory in inventories.items():
        _reconcile_inventory(fleet, provider_name, inventory, now, counts, keep_unrecorded)

    held = {(p, vm.name) for p, inv in inventories.items() for vm in inv}
    stuck_before = now - 2.0 * fleet.config.lock_expire_s
    for pool in fleet.config.pools:
        for name in fleet.store.pool_vms(pool, VMState.RESERVED, max_score=stuck_before):
            _reconcile_reserved(fleet, name, counts)
        for name in fleet.store.pool_vms(pool, VMState.PENDING, max_score=inventory_started):
            vm = fleet.store.get_vm(name)
            if vm is None or vm.provider not in inventories or (vm.provider, name) in held:
                continue
            _reconcile_lost(fleet, vm, counts)
    held_names = {name for _, name in held}
    running = [n for p in fleet.config.pools for n in fleet.store.pool_vms(p, VMState.RUNNING)]
    for vm in fleet.store.get_vms(n for n in running if n not in held_names):
        _reconcile_vanished(fleet, vm, inventories, inventory_started, counts)
    return {code.value: n for code, n in counts.items()}


def _reconcile_vanished(
    fleet: Fleet,
    vm: VMRecord,
    inventories: dict[str, list[ProviderVM]],
    since: float,
    counts: Counts,
) -> None:
    """End a handed-out VM its provider no longer holds.

    A handed-out VM its provider no longer holds (listed before it was handed out does
    not count): asked again alone, then ended, so its holder sees it gone and its record
    goes the way of every finished VM."""
    handed = vm.checkout_at or vm.ready_at
    if (
        vm.state != VMState.RUNNING
        or vm.provider not in inventories
        or not handed
        or handed > since
    ):
        return
    provider = fleet.provider_for(vm)
    try:
        if provider is None or provider.get_vm(vm.pool, vm.name) is not None:
            return
    except Exception as exc:
        log.warning("reconcile %s: provider error: %s", vm.name, exc)
        counts[ReconcileCount.PROVIDER_ERROR] += 1
        return
    outcome = fleet.store.end_vm_lifetime(
        vm.name, actor=fleet.who("reconcile"), force=True, reason="vanished at the provider"
    )
    note_outcome("end_vm_lifetime", vm.name, outcome)
    if outcome.ok:
        log.warning("reconcile: handed-out VM %s vanished at %s", vm.name, vm.provider)
        fleet.dispatch.send(Job.DESTROY_VM, [vm.name])
        counts[ReconcileCount.RUNNING_LOST] += 1


def _reconcile_inventory(
    fleet: Fleet,
    provider_name: str,
    inventory: list[ProviderVM],
    now: float,
    counts: Counts,
    keep_unrecorded: bool,
) -> None:
    provider = fleet.providers[provider_name]
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
            if not pvm.owned or keep_unrecorded:
                kept = ReconcileCount.UNRECORDED_KEPT if pvm.owned else None
                counts[kept or ReconcileCount.UNRECORDED_NOT_OWNED] += 1
                continue
            if now - pvm.created_at < fleet.config.reconcile_grace_s:
                counts[ReconcileCount.UNRECORDED_IN_GRACE] += 1
                continue
            _destroy_unowned(fleet, provider, pvm, "leaked", counts)
        elif record.provider != provider_name:
            log.warning(
                "reconcile: %s holds %s, recorded under provider %r; left alone",
                provider_name,
                pvm.name,
                record.provider,
            )
        elif record.state == VMState.COMPLETED:
            fleet.dispatch.send(Job.DESTROY_VM, [pvm.name])
            counts[ReconcileCount.DESTROY_DISPATCHED] += 1
        elif record.state == VMState.DESTROYED:
            _destroy_unowned(fleet, provider, pvm, "resurrected", counts)


def _destroy_unowned(
    fleet: Fleet, provider: Provider, pvm: ProviderVM, why: Unowned, counts: Counts
) -> None:
    """Destroy a provider VM no live record can claim.

    Its record is missing or destroyed. Under the VM's lock, so it does not race a late
    create of the same name."""

    def step(lock: FencedLock) -> None:
        record = fleet.store.get_vm(pvm.name)
        if record is not None and record.state != VMState.DESTROYED:
            counts[ReconcileCount.SKIPPED_RECORDED] += 1  # a record appeared: not ours to destroy
            return
        if record is None and fleet.identity.marks().lost:  # Redis lost its data meanwhile
            counts[ReconcileCount.UNRECORDED_KEPT] += 1
            return
        lock.ensure_held()
        if not provider.destroy_vm(pvm.pool, pvm.name):
            counts[ReconcileCount(f"{why}_gone")] += 1  # gone meanwhile: nothing was destroyed
            return
        log.info("reconcile: destroyed %s VM %s at %s", why, pvm.name, provider.name)
        counts[ReconcileCount(f"{why}_destroyed")] += 1

    try:
        missed = run_locked(fleet, "vm", pvm.name, "reconcile", step)
    except Exception as exc:
        log.warning("reconcile: destroy of %s VM %s failed: %s", why, pvm.name, exc)
        counts[ReconcileCount.PROVIDER_ERROR] += 1
        return
    if missed is not None:
        counts[missed] += 1


def _reconcile_reserved(fleet: Fleet, name: str, counts: Counts) -> None:
    vm = fleet.store.get_vm(name)
    if vm is None or vm.state != VMState.RESERVED:
        return
    provider = fleet.provider_for(vm)
    if provider is None:
        counts[ReconcileCount.NO_PROVIDER] += 1
        return

    def step(lock: FencedLock) -> bool:
        return _finish_reservation(fleet, name, provider, lock, counts)

    try:
        redispatch = run_locked(fleet, "vm", name, "reconcile", step)
    except Exception as exc:
        log.warning("reconcile %s: provider error: %s", name, exc)
        counts[ReconcileCount.PROVIDER_ERROR] += 1
        return
    if isinstance(redispatch, LockMiss):
        counts[redispatch] += 1  # busy: a create is running, not abandoned
    elif redispatch:  # after our lock is released, so the create job can take it
        fleet.dispatch.send(Job.CREATE_VM, [name])


def _finish_reservation(
    fleet: Fleet, name: str, provider: Provider, lock: FencedLock, counts: Counts
) -> bool:
    """Returns True when create_vm should be dispatched again."""
    vm = fleet.store.get_vm(name)
    if vm is None or vm.state != VMState.RESERVED:
        return False
    actor = fleet.who("reconcile")
    if provider.get_vm(vm.pool, name) is not None:
        lock.ensure_held()
        outcome = fleet.store.vm_created(name, actor=actor, fence=lock.fence)
        note_outcome("vm_created", name, outcome)
        fleet.slots.release(name, lock.fence)
        if outcome.ok and outcome.code == "pending":
            fleet.dispatch.send(Job.CHECK_PENDING_VM, [name])
            counts[ReconcileCount.RESERVATION_CREATED] += 1
        elif outcome.ok or outcome.code == "vm_completed":
            destroy_at_provider(fleet, name, provider, lock)
            counts[ReconcileCount.RESERVATION_RELEASED] += 1
        return False
    # a warm-pool VM (no request) abandoned mid-create fails. The top-up replaces it
    req = fleet.store.get_request(vm.request_id) if vm.request_id else None
    if (
        req is None
        or req.status != RequestStatus.PENDING
        or fleet.store.server_time() >= req.deadline
    ):
        lock.ensure_held()
        outcome = fleet.store.vm_failed(
            name, "create abandoned: the creating worker died", actor=actor, fence=lock.fence
        )
        note_outcome("vm_failed", name, outcome)
        fleet.slots.release(name, lock.fence)
        after_vm_failed(fleet, vm, outcome)
        counts[ReconcileCount.RESERVATION_FAILED] += 1
        return False
    counts[ReconcileCount.RESERVATION_REDISPATCHED] += 1
    return True


def _reconcile_lost(fleet: Fleet, vm: VMRecord, counts: Counts) -> None:
    provider = fleet.provider_for(vm)
    if provider is None:
        return

    def step(lock: FencedLock) -> None:
        current = fleet.store.get_vm(vm.name)
        if current is None or current.state != VMState.PENDING:
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
        note_outcome("vm_failed", vm.name, outcome)
        after_vm_failed(fleet, current, outcome)
        counts[ReconcileCount.PENDING_LOST] += 1

    try:
        missed = run_locked(fleet, "vm", vm.name, "reconcile", step)
    except Exception as exc:
        log.warning("reconcile %s: provider error: %s", vm.name, exc)
        counts[ReconcileCount.PROVIDER_ERROR] += 1
        return
    if missed is not None:
        counts[missed] += 1
