"""The Sentinel side of the connection factory: finding the primary, and following it.

- :class:`MajoritySentinel`: the primary is the address a majority of the sentinels
  name, not the first sentinel's answer.
- :class:`DiscoveringConnection`: a connection to the primary that reconnects through
  the sentinels every time.

Both have an asyncio twin. :mod:`vmpool.state.connection` makes its clients with them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import redis
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelManagedConnection as AsyncSentinelManagedConnection
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelManagedConnection

__all__ = [
    "AsyncDiscoveringConnection",
    "AsyncMajoritySentinel",
    "DiscoveringConnection",
    "MajoritySentinel",
]


def _majority(sentinels: int, votes: Counter[tuple[Any, Any]]) -> tuple[Any, Any] | None:
    """The address a majority of ``sentinels`` name, if one does."""
    for address, count in votes.most_common(1):
        if count > sentinels // 2:
            return address
    return None


def _no_master(service: str, errors: list[str]) -> MasterNotFoundError:
    seen = f": {', '.join(errors)}" if errors else ""
    return MasterNotFoundError(
        f"No master named by a majority of the sentinels for {service!r}{seen}"
    )


class MajoritySentinel(Sentinel):
    """redis-py's Sentinel, whose primary is the address a majority of sentinels name.

    redis-py takes the first sentinel's answer. A sentinel that has not heard of a failover
    yet still names the old primary. That one may be back on its own data, and writes sent
    there would be lost (docs/reliability.md, Findings).
    """

    def discover_master(self, service_name: str) -> tuple[Any, Any]:
        votes: Counter[tuple[Any, Any]] = Counter()
        errors = []
        for sentinel in self.sentinels:
            try:
                masters: dict[str, Any] = sentinel.sentinel_masters()  # type: ignore[assignment]
                state = masters.get(service_name)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                errors.append(repr(exc))
                continue
            if state and self.check_master_state(state, service_name):  # type: ignore[no-untyped-call]
                votes[(state["ip"], state["port"])] += 1
        address = _majority(len(self.sentinels), votes)
        if address is None:
            raise _no_master(service_name, errors)
        return address


class AsyncMajoritySentinel(AsyncSentinel):
    """:class:`MajoritySentinel` for asyncio."""

    async def discover_master(self, service_name: str) -> tuple[Any, Any]:
        votes: Counter[tuple[Any, Any]] = Counter()
        errors = []
        for sentinel in self.sentinels:
            try:
                masters: dict[str, Any] = await sentinel.sentinel_masters()  # type: ignore[assignment]
                state = masters.get(service_name)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                errors.append(repr(exc))
                continue
            if state and self.check_master_state(state, service_name):
                votes[(state["ip"], state["port"])] += 1
        address = _majority(len(self.sentinels), votes)
        if address is None:
            raise _no_master(service_name, errors)
        return address


class DiscoveringConnection(SentinelManagedConnection):
    """A connection to the primary that always reconnects through the sentinels.

    redis-py 8 reconnects a dropped connection, when it next sends, to the address it had,
    not to the one the sentinels name now. A command retried after READONLY (its server
    demoted) met the old primary again and failed.
    """

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self._sock:
            self.connect()  # type: ignore[no-untyped-call]
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


class AsyncDiscoveringConnection(AsyncSentinelManagedConnection):
    """:class:`DiscoveringConnection` for asyncio."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self.is_connected:
            await self.connect()  # type: ignore[no-untyped-call]
        await super().send_packed_command(command, check_health)
