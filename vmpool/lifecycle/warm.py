"""Warm pools: a pool with ``size: N`` is kept at N ready VMs.

``top_up_pools`` (periodic) reserves, for each pool, the VMs it is short of (size minus
ready minus the pool's own reserved and booting VMs), at most ``task_limit`` per pool
per run and each within the fleet's clone limit (the clone semaphore every create
shares), and dispatches ``create_vm`` for them. A pool whose creates fail with a permanent error
(vmpool.lifecycle.failures) reserves none while it backs off, then one VM at a time, a
probe, until a create goes through. The ordinary create and pending-check
jobs then make them ready (the store runs the warm-pool variant of each transition for
a VM no request holds). ``check_ready`` (periodic, vmpooler's check_ready) recycles
ready VMs past the pool's ``ready_ttl``, those the provider no longer holds or says are
not ready, and those beyond a pool's size (the size shrank). Each goes to destruction
and the next top-up replaces it. ``claim_ready`` lets an on-demand request take ready
VMs of its pools before any is cloned (``ondemand_from_ready``, per pool).

Every state change is one checked store transition (vmpool/state/pool_store.py). The
pool's size is enforced inside ``pool_reserve``'s unit, so two top-ups at once never
over-fill a pool.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from redis.client import Pipeline

from vmpool.config import PoolConfig
from vmpool.ids import Job
from vmpool.lifecycle.failures import top_up_allowance
from vmpool.lifecycle.fleet import Fleet, note_outcome
from vmpool.lifecycle.outcomes import RecycleReason, ReserveCode, StoreCode
from vmpool.lifecycle.overrides import effective_pools
from vmpool.lifecycle.quotas import cores_of
from vmpool.lifecycle.reserving import reserve_fresh
from vmpool.state.quotas import NO_LIMITS, QuotaLimits
from vmpool.state.records import Outcome, RequestRecord, VMRecord
from vmpool.state.semaphore import SlotTerms
from vmpool.state.transitions import RequestStatus, VMState

__all__ = ["ReadyRead", "check_ready", "claim_ready", "pools_with_ready", "top_up_pools"]

log = logging.getLogger(__name__)


def top_up_pools(fleet: Fleet) -> dict[str, int]:
    """Reserve what each warm pool is short of and dispatch the creates.

    Returns the VMs reserved per pool."""
    pools = [
        pool
        for pool in effective_pools(fleet)  # runtime size and template (overrides.py)
        if pool.size > 0 and pool.provider in fleet.providers
    ]
    if not pools:
        return {}
    counts = fleet.store.pools.warm_counts(pool.name for pool in pools)
    allowed = top_up_allowance(fleet, (pool.name for pool in pools))
    made: dict[str, int] = {}
    names: list[str] = []
    for pool in pools:
        have = counts[pool.name]
        deficit = min(pool.size - have["ready"] - have["warming"], fleet.config.task_limit)
        if pool.name in allowed:  # failing for good: none while backing off, then a probe
            deficit = min(deficit, allowed[pool.name] - have["warming"])
        for _ in range(max(0, deficit)):
            code = _reserve_warm(fleet, pool, names)
            if code != ReserveCode.RESERVED:
                log.info("top-up %s stopped: %s", pool.name, code)
                break
            made[pool.name] = made.get(pool.name, 0) + 1
    if names:
        fleet.dispatch.send(Job.CREATE_VM, names)
    return made


def _reserve_warm(fleet: Fleet, pool: PoolConfig, names: list[str]) -> ReserveCode | StoreCode:
    """Reserve one warm VM of ``pool``.

    It holds a clone slot that its create job takes over. Returns the code of
    :func:`~vmpool.lifecycle.reserving.reserve_fresh`."""

    def reserve(name: str, slot: SlotTerms) -> Outcome:
        return fleet.store.pools.reserve_pool_vm(
            name,
            pool=pool.name,
            template=pool.template,
            provider=pool.provider,
            domain=pool.domain,
            size=pool.size,
            data_ttl_s=fleet.config.data_ttl_s,
            actor=fleet.who("top_up_pools"),
            cores=cores_of(fleet, pool.name),
            slot=slot,
        )

    got = reserve_fresh(fleet, "reserve_pool_vm", reserve)
    if got.code == ReserveCode.RESERVED:
        names.append(got.name)
    return got.code


def check_ready(fleet: Fleet) -> dict[str, int]:
    """Recycle the ready VMs that must go.

    Past ``ready_ttl``, failing the provider's check, or beyond the pool's size. Returns
    counts by reason."""
    now = fleet.store.server_time()
    by_pool = fleet.store.pools_vms(list(fleet.config.pools), VMState.READY)
    counts: dict[str, int] = {}
    recycled: list[str] = []
    pools = {pool.name: pool for pool in effective_pools(fleet)}  # runtime sizes
    for pool_name, names in by_pool.items():
        pool = pools[pool_name]
        excess = max(0, len(names) - pool.size)
        for i, vm in enumerate(fleet.store.get_vms(names)):
            reason, min_age = _why_recycle(fleet, pool, vm, now, excess=i < excess)
            if not reason:
                continue
            outcome = fleet.store.pools.recycle_vm(
                vm.name, reason, actor=fleet.who("check_ready"), min_ready_s=min_age
            )
            note_outcome("recycle", vm.name, outcome)
            if outcome.ok:
                recycled.append(vm.name)
                counts[reason.value] = counts.get(reason.value, 0) + 1
    if recycled:
        fleet.dispatch.send(Job.DESTROY_VM, recycled)
    return counts


def _why_recycle(
    fleet: Fleet, pool: PoolConfig, vm: VMRecord, now: float, *, excess: bool
) -> tuple[RecycleReason | None, float | None]:
    """(reason, least ready age the script must re-check) or (None, None) to keep it."""
    ttl = pool.ready_ttl_s
    if ttl is not None and vm.ready_at is not None and now - vm.ready_at >= ttl:
        return RecycleReason.READY_TTL, ttl
    if excess:
        return RecycleReason.POOL_SHRANK, None
    provider = fleet.providers.get(vm.provider)
    if provider is None:
        return None, None  # left alone. The audit reports a VM whose provider is gone
    try:
        ok = provider.get_vm(vm.pool, vm.name) is not None and provider.is_ready(vm.pool, vm.name)
    except Exception as exc:  # a provider hiccup is not a failed VM: next check retries
        log.warning("check_ready %s: provider error: %s", vm.name, exc)
        return None, None
    return (RecycleReason.FAILED_CHECK, None) if not ok else (None, None)


def pools_with_ready(fleet: Fleet) -> frozenset[str]:
    """The pools that lend (``ondemand_from_ready``) and hold a ready VM now: one read.

    A provision claim asks once for its requests (:func:`claim_ready`'s ``ready``): no
    claim script for a request whose pools have nothing to lend. A VM that turns ready
    after the read is lent to a later request; this one clones. A provision claim reads
    them in the round trip that grants its locks (:class:`ReadyRead`).
    """
    read = ReadyRead(fleet)
    if not read.pools:
        return frozenset()
    with fleet.redis.pipeline(transaction=False) as pipe:
        read.queue(pipe)
        return read.found(pipe.execute())


class ReadyRead:
    """The read of :func:`pools_with_ready`, to queue on a pipeline with other commands."""

    def __init__(self, fleet: Fleet) -> None:
        self.keys = fleet.keys
        self.pools = sorted(n for n, pool in fleet.config.pools.items() if pool.ondemand_from_ready)

    def queue(self, pipe: Pipeline) -> None:
        """Queue the read: one ZCARD per lending pool."""
        for name in self.pools:
            pipe.zcard(self.keys.pool_state(name, "ready"))

    def found(self, replies: Sequence[Any]) -> frozenset[str]:
        """The lending pools whose count in ``replies`` (the read's, in order) is not 0."""
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return frozenset(name for name, n in zip(self.pools, replies, strict=True) if int(n))


def claim_ready(
    fleet: Fleet,
    req: RequestRecord,
    limits: QuotaLimits = NO_LIMITS,
    ready: frozenset[str] | None = None,
) -> tuple[list[str], str]:
    """Let a pending request take ready VMs of its pools.

    Only pools whose ``ondemand_from_ready`` is on lend, before anything is cloned for
    it. Returns the VMs it took and the claim's code. The claim is one unit, bounded by
    the request's slots and its user's quota ``limits``. ``ready``: the lending pools
    known to hold a ready VM (:func:`pools_with_ready`); None: not known, every lending
    pool is tried."""
    lending = sorted(
        {
            slot.pool
            for slot in req.slots
            if slot.want > slot.live
            and (pool := fleet.config.pools.get(slot.pool)) is not None
            and pool.ondemand_from_ready
            and (ready is None or slot.pool in ready)
        }
    )
    if not lending or req.status != RequestStatus.PENDING:
        return [], ""
    claim = fleet.store.pools.claim_for_request(
        req.id, lending, actor=fleet.who("provision"), quota=limits
    )
    if claim.ok:
        log.info("request %s took ready VMs: %s", req.id, ", ".join(claim.names))
        return list(claim.names), claim.code
    return [], claim.code
