"""Durability of acknowledged writes: what a write waits for before vmpool says "done".

Redis answers a write once it is in its memory. Two ways to lose such a write remain.

- A crash or power loss before the append-only file (AOF) reached the disk. vmpool
  relies on ``appendfsync always`` for this: Redis then fsyncs before it replies (one
  fsync per event-loop turn for all clients, a group commit). The startup check names
  any other ``appendfsync`` as a risk (:mod:`vmpool.state.redis_check`). ``WAITAOF``
  under ``appendfsync everysec`` was measured as the per-write alternative, and
  rejected. Valkey 9.1.2 answers it on its next event-loop turn without an fsync when no
  write is buffered. A power cut played exactly (the AOF cut back to its last fsync)
  lost WAITAOF-acknowledged writes (docs/reliability.md).
- A failover to a replica the write had not reached: replication is asynchronous. Per
  write, ``WAIT N T`` runs in the same round trip: N replicas hold every write of this
  connection. Through Sentinel, N is every replica the sentinels could promote, as they
  report the group now (:mod:`vmpool.state.group_watch`): whichever is promoted holds
  the write, in a planned switch and a partition too. A write is also not acknowledged
  through a primary a majority of the sentinels no longer name.

Not acknowledged: a write whose confirmations do not all come within ``T``. The
script's reply is dropped and :class:`WriteNotConfirmed` is raised. The write may still
be on the primary (nothing undoes it). The API answers 503 with the request id, so the
client can look it up. A job fails and the sweeps run it again.

Reads: ``WAIT`` confirms every earlier write of the connection's stream. So a confirmed
write confirms the state it was decided on, whoever wrote it. A read answered to a
client is confirmed the same way (:meth:`ConfirmingRedis.confirm`). A ``PUBLISH``
(replicated, allowed when Redis is full) moves the connection's offset to "now", and
the same wait follows. The API never shows a state a failover could take back.

The setting (``:redis: durability``, docs/operations.md, "Durability"):

- ``auto`` (the default): through Sentinel (a failover is then automatic), every
  replica the sentinels could promote, or ``durability_replicas`` when it is set (fewer
  trades safety for availability: the startup check names it). Otherwise nothing: the
  startup check names a primary that has replicas.
- ``replicas``: the same through Sentinel; otherwise ``durability_replicas`` (1 unset).
- ``none``: nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, get_args

import redis
import redis.asyncio as aredis

__all__ = [
    "DURABILITY_MODES",
    "NO_DURABILITY",
    "ConfirmingAsyncRedis",
    "ConfirmingRedis",
    "Durability",
    "DurabilityMode",
    "DurabilitySetting",
    "DurabilitySource",
    "Guard",
    "WriteNotConfirmed",
    "confirm",
    "confirm_async",
    "resolve_durability",
]

DurabilityMode = Literal["auto", "none", "replicas"]
DURABILITY_MODES: Final[tuple[str, ...]] = get_args(DurabilityMode)
# The channel of the read confirmation's PUBLISH (nobody subscribes: only its place in
# the replication stream matters).
CONFIRM_CHANNEL: Final = "vmpool:confirm"
_REPLICA_REFUSAL = "cannot be used with replica instances"


class WriteNotConfirmed(redis.RedisError):
    """A write (or a read) whose durability could not be confirmed in time.

    It is not acknowledged. Not a ConnectionError, so that redis-py does not run it again.
    """


@dataclass(frozen=True)
class DurabilitySetting:
    """``:redis: durability``, ``durability_replicas``, ``durability_timeout`` (seconds).

    ``replicas`` None: not set (every replica the sentinels could promote).
    """

    mode: DurabilityMode
    replicas: int | None
    timeout_s: float


class Guard(Protocol):
    """What else a confirmed write must pass.

    :class:`~vmpool.state.group_watch.FollowingDurability` is one.
    """

    def refusal(self) -> str | None:
        """Why the write must not be acknowledged, or None."""

    def shortfall(self) -> None:
        """A WAIT came short: find out why (ask the sentinels again)."""


@dataclass(frozen=True)
class Durability:
    """The confirmations every acknowledged write waits for.

    ``replicas`` replicas holding it (WAIT), within ``timeout_s``. ``automatic``: the
    count is every replica the sentinels could promote, as they report the group now.
    ``guard``: checked once the replies are in.
    """

    replicas: int
    timeout_s: float
    automatic: bool = False
    guard: Guard | None = field(default=None, compare=False, repr=False)

    @property
    def waits(self) -> bool:
        return self.replicas > 0

    def describe(self) -> str:
        """In words, naming the command: what the startup check and the audit print."""
        whom = " (every replica the sentinels could promote)" if self.automatic else ""
        if not self.replicas:
            return "none (a write is acknowledged once the primary has it)" + whom
        plural = "s" if self.replicas > 1 else ""
        return (
            f"WAIT {self.replicas}: held by {self.replicas} replica{plural} within"
            f" {self.timeout_s:g} s{whom}"
        )

    def queue(self, pipe: redis.client.Pipeline | aredis.client.Pipeline) -> None:
        """Queue the wait on ``pipe``, after the write(s) it holds (one connection)."""
        if self.replicas:
            pipe.wait(self.replicas, max(1, round(self.timeout_s * 1000)))

    def check(self, replies: Sequence[Any]) -> None:
        """Raise unless ``replies`` (of :meth:`queue`'s commands) confirm the write."""
        for reply in replies:
            if isinstance(reply, redis.ResponseError):
                if _REPLICA_REFUSAL in str(reply):  # connected to a replica
                    raise redis.ReadOnlyError(str(reply))
                raise WriteNotConfirmed(f"durability confirmation refused: {reply}")
        if self.replicas and int(replies[0]) < self.replicas:
            if self.guard is not None:
                self.guard.shortfall()
            raise WriteNotConfirmed(
                f"write not confirmed within {self.timeout_s:g} s: held by {int(replies[0])}"
                f" of the {self.replicas} replica(s) it waits for"
            )
        refusal = None if self.guard is None else self.guard.refusal()
        if refusal is not None:
            raise WriteNotConfirmed(f"write not confirmed: {refusal}")


NO_DURABILITY: Final = Durability(replicas=0, timeout_s=0.0)


def resolve_durability(setting: DurabilitySetting) -> Durability:
    """What ``setting`` means for a Redis not reached through Sentinel.

    Through Sentinel the group decides (:class:`~vmpool.state.group_watch.FollowingDurability`).
    """
    replicas = (setting.replicas or 1) if setting.mode == "replicas" else 0
    return Durability(replicas, setting.timeout_s)


class DurabilitySource(Protocol):
    """Where a client's durability comes from when it follows the group."""

    def current(self) -> Durability: ...

    def close(self) -> None: ...


class _Confirming:
    """What both clients share: the durability, fixed or following the group."""

    _fixed: Durability = NO_DURABILITY
    source: DurabilitySource | None = None
    via_sentinel: bool = False

    @property
    def durability(self) -> Durability:
        """The confirmations a write waits for now (read once per write)."""
        return self.source.current() if self.source is not None else self._fixed

    @durability.setter
    def durability(self, value: Durability) -> None:
        self._fixed = value
        self.source = None

    def _close_source(self) -> None:
        if self.source is not None:
            self.source.close()


class ConfirmingRedis(_Confirming, redis.Redis):
    """A client whose every script call returns only once its durability is confirmed.

    Every state change vmpool makes is a script call (see the module docstring).
    :func:`vmpool.state.connection.connect` makes these clients and sets
    :attr:`durability` (or its ``source``).
    """

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:  # type: ignore[override]
        durability = self.durability
        if not durability.waits:
            return super().evalsha(sha, numkeys, *keys_and_args)
        with self.pipeline(transaction=False) as pipe:
            pipe.evalsha(sha, numkeys, *keys_and_args)
            durability.queue(pipe)
            replies = pipe.execute(raise_on_error=False)
        if isinstance(replies[0], Exception):
            raise replies[0]  # NOSCRIPT included: redis-py's Script loads and calls again
        durability.check(replies[1:])
        return replies[0]

    def confirm(self) -> None:
        """Confirm every write Redis holds now, before a read is answered as a fact.

        Whoever made the writes, they are confirmed as a write of this connection would be.
        """
        durability = self.durability
        if not durability.waits:
            return
        with self.pipeline(transaction=False) as pipe:
            pipe.publish(CONFIRM_CHANNEL, "")
            durability.queue(pipe)
            replies = pipe.execute(raise_on_error=False)
        if isinstance(replies[0], Exception):
            raise replies[0]
        durability.check(replies[1:])

    def close(self) -> None:
        self._close_source()
        super().close()


def confirm(client: redis.Redis) -> None:
    """:meth:`ConfirmingRedis.confirm` on ``client``.

    Nothing for a client made elsewhere (a test's plain client: no durability to confirm).
    """
    if isinstance(client, ConfirmingRedis):
        client.confirm()


async def confirm_async(client: aredis.Redis) -> None:
    """:meth:`ConfirmingAsyncRedis.confirm` on ``client``. Nothing for another client."""
    if isinstance(client, ConfirmingAsyncRedis):
        await client.confirm()


class ConfirmingAsyncRedis(_Confirming, aredis.Redis):  # type: ignore[misc]  # redis-py's own bases
    """The asyncio twin of :class:`ConfirmingRedis`, for the API's hot paths.

    Those paths pipeline their scripts themselves: :func:`vmpool.state.lua.run_pipelined_async`
    queues :meth:`Durability.queue`.
    """

    async def confirm(self) -> None:
        """:meth:`ConfirmingRedis.confirm`, awaited.

        One round trip when the durability waits for something, none otherwise.
        """
        durability = self.durability
        if not durability.waits:
            return
        pipe = self.pipeline(transaction=False)
        pipe.publish(CONFIRM_CHANNEL, "")
        durability.queue(pipe)
        replies = await pipe.execute(raise_on_error=False)
        if isinstance(replies[0], Exception):
            raise replies[0]
        durability.check(replies[1:])

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        self._close_source()
        await super().aclose(close_connection_pool)
