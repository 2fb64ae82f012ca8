"""The quotas as the rest of vmpool reads them: resolved, immutable, in seconds.

Made by :func:`vmpool.config.quota_settings.build_quotas` from the ``:quotas:`` section
(whose model holds every default), held by :class:`~vmpool.config.model.Config` as
``quotas``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Quota", "QuotaConfig"]


@dataclass(frozen=True)
class Quota:
    """One user's share of the fleet (None: no limit) and their requests' priority.

    ``priority`` is both the priority of a request that names none and the highest
    (numerically lowest) one the user may name: 1 highest, 3 lowest.
    """

    max_vms: int | None
    max_cores: int | None
    priority: int


@dataclass(frozen=True)
class QuotaConfig:
    """``:quotas:``: every user's quota (``default``, or their own in ``users``).

    ``priority_aging_s``: how long a waiting request takes to rise one priority level.
    """

    default: Quota
    users: Mapping[str, Quota]
    priority_aging_s: float

    def of(self, user: str) -> Quota:
        """The quota of ``user`` (the token's user; '' for a request made without one)."""
        return self.users.get(user, self.default)

    def limits(self, user: str) -> tuple[int | None, int | None]:
        """``user``'s (max_vms, max_cores), None for no limit; none for '' (no user)."""
        if not user:
            return None, None
        quota = self.of(user)
        return quota.max_vms, quota.max_cores

    def lead_s(self, priority: int) -> float:
        """How far ahead of its arrival a request of ``priority`` stands in line (seconds).

        Priority 2 stands at its arrival, 1 one aging period ahead, 3 one behind (its place
        is its arrival minus this lead): so a request that has waited one period more
        stands level with one of the level above it.
        """
        return (2 - priority) * self.priority_aging_s

    @property
    def counts_cores(self) -> bool:
        """Whether any quota limits cores (then a VM's cores are asked of its provider)."""
        quotas = [self.default, *self.users.values()]
        return any(q.max_cores is not None for q in quotas)
