"""What a booting VM's check records, and the batched check of the cloud providers.

``observe_pending`` turns one answer of the cloud (the VM as it holds it, or nothing)
into the VM's next state: ``vm_ready`` (with the cloud's address as hostname when the
pool has no domain), ``vm_failed`` when it vanished or is past its pool's timeout, or
nothing while it boots. Both paths use it: ``check_pending_vm`` (one VM, one question)
and ``check_batched``, which the pending sweep runs for providers that answer for many
VMs at once (:class:`~vmpool.providers.StatusBatch`): one list call per provider per
sweep for every pending VM, never one cloud call per VM per tick. Only the VMs whose
answer changes something take their lock; every change is the same fenced transition
as in ``check_pending_vm``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from vmpool.lifecycle.failpoints import failpoint
from vmpool.lifecycle.fleet import Fleet, after_vm_failed, dispatch_released, note_outcome
from vmpool.providers import ProviderVM, StatusBatch
from vmpool.state.locks import FencedLock, LockBusy, LockLost
from vmpool.state.records import VMRecord

__all__ = ["VANISH_GRACE_S", "check_batched", "observe_pending"]

log = logging.getLogger(__name__)

# A cloud's list may lag its create by a moment (EC2's DescribeInstances is eventually
# consistent): a VM created less than this long ago and missing from a list is booting,
# not vanished. The per-VM check and the reconciler are not affected.
VANISH_GRACE_S = 30.0


def observe_pending(
    fleet: Fleet,
    vm: VMRecord,
    lock: FencedLock,
    held: ProviderVM | None,
    ready: bool,
    *,
    listed: bool = False,
) -> str:
    """Record what the cloud said of pending ``vm`` (re-read under ``lock``).
    ``listed``: the answer came from a list that may lag a create (a batching
    provider), so a VM missing from it is given ``VANISH_GRACE_S``.

    Returns the store's code ('running', 'fulfilled', 'completed', 'retry',
    'request_failed', 'failed', or a refusal) or 'booting' when nothing changed."""
    name = vm.name
    actor = fleet.who("check_pending")
    if held is None and listed and _age(vm, fleet.store.server_time()) < VANISH_GRACE_S:
        return "booting"
    if held is None:
        reason = "VM vanished at the provider while booting"
    elif ready:
        lock.ensure_held()
        failpoint("check_pending.before_commit")
        outcome = fleet.store.vm_ready(
            name, actor=actor, fence=lock.fence, hostname=_hostname(vm, held)
        )
        note_outcome("vm_ready", name, outcome)
        if outcome.ok and outcome.code == "completed":
            fleet.dispatch.destroy_vm(name)
            dispatch_released(fleet, vm.request_id)
        return outcome.code
    else:
        timeout_s = fleet.pool_timeout_s(vm.pool)
        since = vm.created_at if vm.created_at is not None else vm.state_since
        if since is None or fleet.store.server_time() - since < timeout_s:
            return "booting"
        reason = f"timeout: not ready {timeout_s:g}s after create"
    lock.ensure_held()
    failed = fleet.store.vm_failed(name, reason, actor=actor, fence=lock.fence)
    note_outcome("vm_failed", name, failed)
    after_vm_failed(fleet, vm, failed)
    if failed.ok:
        return failed.code if failed.code != "completed" else "failed"
    return failed.code


def _hostname(vm: VMRecord, held: ProviderVM) -> str:
    """The cloud's address when the pool has no domain (the record's hostname is then
    the bare name); '' keeps ``<name>.<domain>``."""
    if vm.hostname == vm.name and held.hostname and held.hostname != vm.name:
        return held.hostname
    return ""


def check_batched(fleet: Fleet, names: Sequence[str]) -> list[str]:
    """Check the pending VMs of batching providers, one list call per provider; return
    the names left for per-VM checks (their provider does not batch). Without a
    batching provider configured this costs nothing (no read)."""
    batching = {n for n, p in fleet.providers.items() if isinstance(p, StatusBatch)}
    if not batching or not names:
        return list(names)
    rest: list[str] = []
    by_provider: dict[str, list[VMRecord]] = {}
    for vm in fleet.store.get_vms(names):
        if vm.provider in batching:
            by_provider.setdefault(vm.provider, []).append(vm)
        else:
            rest.append(vm.name)
    now = fleet.store.server_time()
    for provider_name, vms in by_provider.items():
        provider = fleet.providers[provider_name]
        assert isinstance(provider, StatusBatch)
        try:
            seen = provider.statuses([vm.name for vm in vms])
        except Exception as exc:
            log.warning("check_pending: %s did not answer: %s", provider_name, exc)
            continue
        for vm in vms:
            if _due(fleet, vm, seen.get(vm.name), now):
                _observe_locked(fleet, vm.name, seen.get(vm.name))
    return rest


def _age(vm: VMRecord, now: float) -> float:
    since = vm.created_at if vm.created_at is not None else vm.state_since
    return now - since if since is not None else 0.0


def _due(fleet: Fleet, vm: VMRecord, held: ProviderVM | None, now: float) -> bool:
    """Whether the answer changes anything (so the VM's lock is worth taking)."""
    age = _age(vm, now)
    if held is None:
        return age >= VANISH_GRACE_S
    return held.state == "running" or age >= fleet.pool_timeout_s(vm.pool)


def _observe_locked(fleet: Fleet, name: str, held: ProviderVM | None) -> str:
    try:
        with fleet.lock("vm", name, "check_pending") as lock:
            vm = fleet.store.get_vm(name)  # re-read under the lock
            if vm is None or vm.state != "pending":
                return "no_vm" if vm is None else f"vm_{vm.state}"
            ready = held is not None and held.state == "running"
            return observe_pending(fleet, vm, lock, held, ready, listed=True)
    except LockBusy:
        return "busy"
    except LockLost as exc:
        log.warning("check_pending %s stopped: %s", name, exc)
        return "lock_lost"

