"""``record_history`` (periodic): each pool's counts of this minute, for the dashboard.

The point of the current minute (Redis server time) of every configured pool: its ready,
running and pending (reserved and booting) VMs, its size as set now (runtime overrides
included), and its totals of VMs created and destroyed. One slot per minute, so a run
repeated within a minute only refreshes it (vmpool.state.history has the ring and its
bounds). Four round trips whatever the number of pools.
"""

from __future__ import annotations

from vmpool.lifecycle.fleet import Fleet
from vmpool.lifecycle.overrides import effective_pools
from vmpool.state.counters import VMS_METRIC, vm_totals
from vmpool.state.history import Point, minute_of, write_points
from vmpool.state.records import decode_hash
from vmpool.state.transitions import VMState

__all__ = ["record_history"]


def record_history(fleet: Fleet) -> int:
    """Write this minute's point of every configured pool. Returns how many were written."""
    pools = effective_pools(fleet)  # sizes as set at runtime
    counts = fleet.store.pool_counts(pool.name for pool in pools)
    pipe = fleet.redis.pipeline(transaction=False)
    pipe.time()
    pipe.hgetall(fleet.keys.metrics(VMS_METRIC))
    (seconds, micros), raw_totals = pipe.execute()
    minute = minute_of(float(seconds) + float(micros) / 1e6)
    totals = decode_hash(raw_totals)
    points = []
    for pool in pools:
        c = counts[pool.name]
        created, destroyed = vm_totals(totals, pool.name)
        points.append(
            (
                pool.name,
                Point(
                    minute=minute,
                    ready=c[VMState.READY],
                    running=c[VMState.RUNNING],
                    pending=c[VMState.RESERVED] + c[VMState.PENDING],
                    size=pool.size,
                    created=created,
                    destroyed=destroyed,
                ),
            )
        )
    return write_points(fleet.redis, fleet.keys, points)
