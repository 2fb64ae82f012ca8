"""Failures in plain sight: what the lifecycle notes when a create, a boot or a request fails.

- :func:`create_failed_noted`: a failed create counts toward its pool's streak (and, when
  permanent, its top-ups' back-off: vmpool.state.pool_failures), toward vmpooler's error
  counter (``vmpooler_errors_total{type="create_failed"}`` on /metrics), and joins the
  latest-failures list. The failure that begins a streak is logged once as a WARNING,
  which `vmpool up` shows on its screen; the rest of the streak is logged at INFO.
- :func:`boot_failed_noted` and :func:`requests_failed_noted`: the latest-failures list.
- :func:`top_up_allowance`: how many VMs a pool whose creates fail permanently may
  reserve now (none while it backs off, then one: a probe).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from vmpool.lifecycle.fleet import Fleet
from vmpool.state.counters import record_error
from vmpool.state.pool_failures import read_pool_failures, record_failure
from vmpool.state.records import VMRecord
from vmpool.state.transitions import RequestStatus

__all__ = [
    "CREATE_FAILED",
    "boot_failed_noted",
    "create_failed_noted",
    "requests_failed_noted",
    "top_up_allowance",
]

log = logging.getLogger(__name__)

CREATE_FAILED = "create_failed"  # the `type` of vmpooler_errors_total a failed create counts as


def create_failed_noted(fleet: Fleet, vm: VMRecord, reason: str, *, permanent: bool) -> None:
    """Note a failed create of ``vm``: its pool's streak, the error counter, the list."""
    streak = record_failure(
        fleet.redis,
        fleet.keys,
        "create",
        pool=vm.pool,
        vm=vm.name,
        request_id=vm.request_id,
        reason=reason,
        permanent=permanent,
    )
    record_error(fleet.redis, fleet.keys, CREATE_FAILED, vm.pool)
    if streak.started:
        then = "its top-ups back off" if streak.retry_at is not None else "creates go on"
        log.warning("pool %s: creates fail (%s); %s: %s", vm.pool, vm.name, then, reason)
    else:
        log.info(
            "pool %s: %d creates failed in a row (%s): %s",
            vm.pool,
            streak.consecutive,
            vm.name,
            reason,
        )


def boot_failed_noted(fleet: Fleet, vm: VMRecord, reason: str) -> None:
    record_failure(
        fleet.redis,
        fleet.keys,
        "boot",
        pool=vm.pool,
        vm=vm.name,
        request_id=vm.request_id,
        reason=reason,
    )


def requests_failed_noted(fleet: Fleet, request_ids: Iterable[str]) -> None:
    """Note the requests that failed (out of time), each with its failure reason."""
    for rid in request_ids:
        record = fleet.store.get_request(rid)
        if record is None or record.status != RequestStatus.FAILED:
            continue
        pools = sorted({slot.pool for slot in record.slots})
        record_failure(
            fleet.redis,
            fleet.keys,
            "request",
            pool=",".join(pools),
            request_id=rid,
            reason=record.failure_reason,
        )


def top_up_allowance(fleet: Fleet, pools: Iterable[str]) -> dict[str, int]:
    """The most a pool's top-up reserves now while a permanent error holds it back.

    0 while the pool backs off, then 1 (a probe) until a create goes through. Pools
    without a permanent error in their streak are left out (no bound: a transient
    failure is the cloud's breaker's business). One round trip."""
    now, failures = read_pool_failures(fleet.redis, fleet.keys, pools)
    return {
        pool: 0 if f.backing_off(now) else 1
        for pool, f in failures.items()
        if f.failing and f.retry_at is not None
    }
