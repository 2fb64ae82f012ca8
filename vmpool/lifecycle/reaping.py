"""The reap pass: VMs whose lifetime is over, and pools the config no longer names.

``reap_running`` ends each running VM past its lifetime (one transition per VM) and
dispatches its destruction. A pool removed from the config (or renamed) keeps its VMs:
the same pass finds the pools whose indexes still hold VMs (``retired_pools``) and does
for them what the frequent sweeps and check_ready do for configured pools, as long as
each VM's provider is configured. A VM whose provider is gone too is left alone, and
``vmpool audit`` reports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vmpool.ids import Job
from vmpool.lifecycle.fleet import Fleet, note_outcome
from vmpool.lifecycle.pending import reserved_grace_s
from vmpool.state.transitions import VMState

__all__ = ["reap_running", "retired_pools"]


def _flat(by_pool: Mapping[str, Sequence[str]]) -> list[str]:
    return [name for names in by_pool.values() for name in names]


def reap_running(fleet: Fleet) -> int:
    """End the VMs whose lifetime is over and dispatch their destruction.

    A VM's running score is its lifetime's end. Returns how many were ended.

    Each ``end_vm_lifetime`` is its own atomic transition (one script per expired VM:
    the cost follows the expired count, not the running count). The destroy dispatch
    for all of them is one batch at the end (a pass that dies before it leaves the VMs
    'completed', which destroy_sweep finds). The pools no longer configured are
    included, and their other work dispatched (``_finish_retired``)."""
    now = fleet.store.server_time()
    retired = retired_pools(fleet)
    pools = [*fleet.config.pools, *retired]
    ended: list[str] = []
    for name in _flat(fleet.store.pools_vms(pools, VMState.RUNNING, max_score=now)):
        outcome = fleet.store.end_vm_lifetime(name, actor=fleet.who("reap"))
        note_outcome("end_vm_lifetime", name, outcome)
        if outcome.ok:
            ended.append(name)
    if ended:
        fleet.dispatch.send(Job.DESTROY_VM, _reachable(fleet, ended))
    if retired:
        _finish_retired(fleet, retired, now)
    return len(ended)


def retired_pools(fleet: Fleet) -> list[str]:
    """The pools whose VM indexes exist in Redis but which the config no longer names.

    One SCAN of the keyspace (``store.pools.indexed_pools``), so only the reap pass (every
    30 s by default) runs it and the frequent sweeps keep their fixed number of round
    trips."""
    return sorted(p for p in fleet.store.pools.indexed_pools() if p not in fleet.config.pools)


def _finish_retired(fleet: Fleet, pools: list[str], now: float) -> None:
    """Finish the VMs of pools no longer configured.

    For pools no longer configured (removed or renamed), what check_pending_sweep,
    destroy_sweep and check_ready do for the configured ones: check booting VMs, create
    again stale reservations, destroy released VMs, and recycle (then destroy) the ready
    ones: no request or checkout can take them any more, and no top-up counts them. Each
    only if its provider is configured."""
    store = fleet.store
    grace = reserved_grace_s(fleet.config)
    pending = _reachable(fleet, _flat(store.pools_vms(pools, VMState.PENDING)))
    stale = _reachable(
        fleet, _flat(store.pools_vms(pools, VMState.RESERVED, max_score=now - grace))
    )
    completed = _reachable(fleet, _flat(store.pools_vms(pools, VMState.COMPLETED)))
    completed += _reachable(fleet, _flat(store.pools_vms(pools, VMState.ON_HOLD, max_score=now)))
    for name in _reachable(fleet, _flat(store.pools_vms(pools, VMState.READY))):
        outcome = store.pools.recycle_vm(name, "pool not configured", actor=fleet.who("reap"))
        note_outcome("recycle", name, outcome)
        if outcome.ok:  # a VM claimed in between is held now: the recycle is refused
            completed.append(name)
    if pending:
        fleet.dispatch.send(Job.CHECK_PENDING_VM, pending)
    if stale:
        fleet.dispatch.send(Job.CREATE_VM, stale)
    if completed:
        fleet.dispatch.send(Job.DESTROY_VM, completed)


def _reachable(fleet: Fleet, names: list[str]) -> list[str]:
    """The VMs among ``names`` whose provider is configured.

    One read for all. The others are left alone (the audit reports them), not dispatched
    to fail every pass."""
    if not names:
        return []
    return [vm.name for vm in fleet.store.get_vms(names) if vm.provider in fleet.providers]
