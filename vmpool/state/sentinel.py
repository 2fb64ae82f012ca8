"""The Sentinel side of the connection factory: finding the primary, and following it.

- :class:`MajoritySentinel`: the primary is the address a majority of the sentinels
  name, not the first sentinel's answer.
- :class:`FollowingConnection`: a connection that leads to the primary the client's
  group watch names now (:mod:`vmpool.state.group_watch`), and reopens there.

Both have an asyncio twin. :mod:`vmpool.state.connection` makes its clients with them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import redis
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelManagedConnection as AsyncSentinelManagedConnection
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelManagedConnection

__all__ = [
    "AsyncFollowingConnection",
    "AsyncMajoritySentinel",
    "FollowingConnection",
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


NamedPrimary = Callable[[], "tuple[str, int] | None"]


def _no_view() -> tuple[str, int] | None:
    return None


class FollowingConnection(SentinelManagedConnection):
    """A connection that leads to the primary the client's group watch names now.

    ``named_primary()`` (:meth:`vmpool.state.group_watch.GroupWatch.named_primary`; None:
    no view, ask the sentinels). Before each send, a connection open to another server
    closes and opens again to the named one: an open connection never goes on writing
    to a primary a majority of the sentinels no longer name. A dropped connection
    reopens the same way: redis-py 8 reopened it to the address it had (a command
    retried after READONLY met the demoted primary again). The pool's address is set to
    where it connects: redis-py's pool keeps a released connection only when it leads
    there, and closes the others.
    """

    def __init__(self, *, named_primary: NamedPrimary = _no_view, **kwargs: Any) -> None:
        self.named_primary = named_primary
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]

    def _connect_retry(self) -> None:
        if self._sock:
            return
        address = self.named_primary()
        if address is None:
            address = self.connection_pool.get_master_address()
        else:  # the pool keeps a released connection only if it leads here
            self.connection_pool.master_address = address
        self.connect_to(address)  # type: ignore[no-untyped-call]

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        named = self.named_primary()
        if self._sock and named is not None and (self.host, self.port) != named:
            self.disconnect()
        if not self._sock:
            self.connect()  # type: ignore[no-untyped-call]
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


class AsyncFollowingConnection(AsyncSentinelManagedConnection):
    """:class:`FollowingConnection` for asyncio."""

    def __init__(self, *, named_primary: NamedPrimary = _no_view, **kwargs: Any) -> None:
        self.named_primary = named_primary
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]

    async def _connect_retry(self) -> None:
        if self._reader:
            return
        address = self.named_primary()
        if address is None:
            address = await self.connection_pool.get_master_address()
        else:  # the pool keeps a released connection only if it leads here
            self.connection_pool.master_address = address
        await self.connect_to(address)  # type: ignore[no-untyped-call]

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        named = self.named_primary()
        if self.is_connected and named is not None and (self.host, self.port) != named:
            await self.disconnect()
        if not self.is_connected:
            await self.connect()  # type: ignore[no-untyped-call]
        await super().send_packed_command(command, check_health)
