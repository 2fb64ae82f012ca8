"""A provider's own limits (``max_instances``, ``max_cores``), counted in Redis.

vmpool stops asking before the cloud says no, as Nodepool does.

The count: the provider's pools' indexes of the VMs the cloud holds or is making
(pending, ready, running, completed, on hold), plus the claims of the creates running now.

A create claims its place in the same unit as the count
(``vmpool/state/scripts/provider_capacity.lua``), so racing workers never exceed a
limit. It gives the claim back when it is over. A dead worker's claim lapses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import redis

from vmpool.state.keys import Keys
from vmpool.state.lua import read_script

__all__ = ["Limits", "ProviderCapacity"]


@dataclass(frozen=True)
class Limits:
    """One provider's limits (0: none) and the cores of one VM of each of its pools."""

    max_instances: int
    max_cores: int
    pool_cores: Mapping[str, int]

    @property
    def any(self) -> bool:
        return self.max_instances > 0 or self.max_cores > 0


class ProviderCapacity:
    """Admission within a provider's limits, shared by every worker through Redis."""

    def __init__(self, redis_client: redis.Redis, keys: Keys, lease_s: float) -> None:
        self.redis = redis_client
        self.keys = keys
        self.lease_s = float(lease_s)
        self._script = redis_client.register_script(
            read_script("vmpool.state.scripts", "provider_capacity.lua")
        )

    def _run(self, op: str, provider: str, member: str, limits: Limits) -> tuple[bool, int, int]:
        pools = sorted(limits.pool_cores)
        keys = [self.keys.provider_launching(provider)]
        for pool in pools:
            held = ("pending", "ready", "running", "completed", "on_hold")  # at the cloud
            keys += [self.keys.pool_state(pool, s) for s in held]
        args: list[str | int] = [
            op,
            repr(self.lease_s),
            member,
            limits.max_instances,
            limits.max_cores,
        ]
        for pool in pools:
            args += [pool, int(limits.pool_cores[pool])]
        reply = self._script(keys=keys, args=args)
        return int(reply[0]) == 1, int(reply[1]), int(reply[2])

    def admit(self, provider: str, pool: str, name: str, limits: Limits) -> tuple[bool, int, int]:
        """Claim a place for VM ``name`` of ``pool``.

        Returns (admitted, instances, cores), as counted before it. A claim it already holds is
        renewed.
        """
        return self._run("admit", provider, f"{pool}|{name}", limits)

    def fits(self, provider: str, limits: Limits) -> bool:
        """Whether one more VM (of its smallest pool) would fit now."""
        return self._run("check", provider, "", limits)[0]

    def release(self, provider: str, pool: str, name: str) -> None:
        self.redis.zrem(self.keys.provider_launching(provider), f"{pool}|{name}")
