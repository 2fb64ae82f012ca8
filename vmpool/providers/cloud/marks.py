"""The marks a cloud provider makes its VMs with and lists them by.

It makes them with its ``fleet_id`` option, else the fleet's identity, and lists them by
that mark and the fleet's other marks (vmpool/state/fleet_identity.py), read from Redis at
every list and create: a process notices at its next cloud call that Redis lost the
identity it held. A VM under a mark the fleet does not own is ``owned=False`` in the
inventory (:class:`vmpool.providers.ProviderVM`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vmpool.providers.base import PermanentProviderError
from vmpool.state.fleet_identity import IdentityWatch

if TYPE_CHECKING:
    from redis import Redis

    from vmpool.state.keys import Keys

__all__ = ["Marks", "ProviderMarks"]


@dataclass(frozen=True)
class Marks:
    """What one provider marks and lists by, as of one read."""

    create: str  # the mark new VMs get
    listed: tuple[str, ...]  # every mark listed, ``create`` first
    owned: frozenset[str]  # the marks whose every VM is the fleet's


class ProviderMarks:
    """One provider's marks: its ``fleet_id`` (``pinned``), else the fleet's identity."""

    def __init__(self, redis: Redis | None, keys: Keys, provider: str, pinned: str | None) -> None:
        self.provider = provider
        self.pinned = pinned
        self.watch = IdentityWatch(redis, keys) if redis is not None else None

    def now(self) -> Marks:
        if self.watch is None:
            if self.pinned is None:
                raise PermanentProviderError(
                    f"configuration error: provider {self.provider!r} has no fleet_id and no"
                    " Redis to keep the fleet's identity in"
                )
            return Marks(self.pinned, (self.pinned,), frozenset({self.pinned}))
        fleet = self.watch.marks()
        own = self.pinned or fleet.identity
        listed = fleet.listed(own)
        return Marks(own, listed, frozenset(m for m in listed if fleet.owns(m, own)))
