"""Quotas per user as the jobs apply them: the limits a reservation or a claim passes, the
cores of a VM, and a request over quota parked until its user frees a VM.

The counting and the checks are the store's, in the units that reserve and free VMs
(:mod:`vmpool.state.quotas`); this module only says, from the config, what limits a
user's request is checked against (:func:`limits_for`) and parks a request the store
refused for its quota (:func:`park`). The provision sweep passes parked requests by, and
offers those whose user has room now (a VM freed unparks them in its own unit; this
also covers a quota raised by a new config) again (:func:`unpark_due`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from vmpool.lifecycle.fleet import Fleet
from vmpool.providers import Capacity
from vmpool.state.quotas import NO_LIMITS, QuotaLimits

__all__ = ["cores_of", "has_quota", "is_quota_refusal", "limits_for", "park", "unpark_due"]

log = logging.getLogger(__name__)


def is_quota_refusal(code: str) -> bool:
    """Whether a store refusal is a user's quota (``quota_max_vms``, ``quota_max_cores``)."""
    return code.startswith("quota_") and code != "quota_free"


def cores_of(fleet: Fleet, pool: str) -> int:
    """The cores one VM of ``pool`` counts against its user's ``max_cores``.

    Its provider's count (a cloud's instance size, asked once per size) when some quota
    limits cores; 1 otherwise, and for a provider that cannot say.
    """
    if not fleet.config.quotas.counts_cores:
        return 1
    config = fleet.config.pools.get(pool)
    provider = fleet.providers.get(config.provider) if config else None
    if not isinstance(provider, Capacity):
        return 1
    try:
        return max(1, int(provider.cores(pool)))
    except Exception as exc:  # the cloud could not say: count 1, ask again next time
        log.warning("pool %s: cannot count its VMs' cores: %s", pool, exc)
        return 1


def has_quota(fleet: Fleet, user: str) -> bool:
    """Whether ``user``'s quota limits anything (the anonymous user '' has none)."""
    return fleet.config.quotas.limits(user) != (None, None)


def limits_for(fleet: Fleet, user: str, pools: Iterable[str]) -> QuotaLimits:
    """The quota ``user``'s request for ``pools`` is checked against.

    NO_LIMITS for a user without one (:func:`has_quota`)."""
    max_vms, max_cores = fleet.config.quotas.limits(user)
    if max_vms is None and max_cores is None:
        return NO_LIMITS
    cores = {pool: cores_of(fleet, pool) for pool in pools} if max_cores is not None else {}
    return QuotaLimits(max_vms, max_cores, cores)


def park(fleet: Fleet, request_id: str, limits: QuotaLimits) -> bool:
    """Park a request the store refused for its user's quota. False: it fits now (a VM
    of the user was freed meanwhile), so try again."""
    outcome = fleet.store.quotas.park(request_id, limits, actor=fleet.who("provision"))
    if outcome.ok:
        log.info("request %s waits for its user's quota", request_id)
    return outcome.code != "quota_free"


def unpark_due(fleet: Fleet, candidates: list[str]) -> list[str]:
    """The provision sweep's candidates less the parked requests whose user has no room.

    A parked request whose user is under their quota as this process's config reads it
    (a quota raised since it was parked) is offered again; its provision parks it again
    if it still does not fit.
    """
    parked = fleet.store.quotas.parked()
    if not parked:
        return candidates
    held = fleet.store.quotas.held()
    room = set()
    for user in set(parked.values()):
        quota = fleet.config.quotas.of(user)
        have = held.get(user)
        vms = have.vms if have else 0
        if quota.max_vms is None or vms < quota.max_vms:
            room.add(user)
    return [rid for rid in candidates if rid not in parked or parked[rid] in room]
