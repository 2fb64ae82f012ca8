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
- A failover to a replica the write had not reached: replication is asynchronous.
  ``WAIT N T``: N replicas hold every write of this connection (a unit of work's,
  below). Through Sentinel, N is every replica the sentinels could promote, as they
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

A unit of work (:func:`confirmed`, :func:`confirmed_async`): a job (each job a worker
runs, ``workers.worker.FleetJob``) or an API call pays one confirmation for all its
writes, not one per script call. In a unit a script call does not wait; the unit's end
sends ``PUBLISH`` and ``WAIT`` in one round trip through one connection. The PUBLISH
puts that connection's offset past every write the server holds, so the WAIT covers the
unit's writes on every connection and client of the process (the pool's, RQ's). A unit
whose script calls made no write sends nothing; one left by an exception is not
confirmed (nothing of it is acknowledged). Before a side effect outside Redis that its
writes or reads decided (a provider's create or destroy), the unit confirms what it has
so far (:func:`settle`, called by ``FencedLock.ensure_held``; a create claim's creates,
what it had once its locks and clone slots were taken: the claim waits once, not once
per create, as the records of its earlier creates decide nothing of the later ones). A
unit's writes all went
to one primary: the guard of its first write refuses it when the primary the sentinels
name changed in its course (:class:`~vmpool.state.group_watch.PinnedPrimary`). The unit
lives in a context variable: the code it runs, and a thread handed its context (the
API's thread pool), join it; another thread's writes wait on their own. A write outside
any unit waits in its own round trip, as above. The worker's loop (its dequeue,
heartbeats and job counters), a batch job's work-set claims and the scheduler's moves
run :func:`unconfirmed`: nothing outside Redis acts on them, and one a failover loses
runs a job again or late (every job is idempotent).

The setting (``:redis: durability``, docs/operations.md, "Durability"):

- ``auto`` (the default): through Sentinel (a failover is then automatic), every
  replica the sentinels could promote, or ``durability_replicas`` when it is set (fewer
  trades safety for availability: the startup check names it). Otherwise nothing: the
  startup check names a primary that has replicas.
- ``replicas``: the same through Sentinel; otherwise ``durability_replicas`` (1 unset).
- ``none``: nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final, Protocol

import redis
import redis.asyncio as aredis

from vmpool.state.confirmation import (
    DURABILITY_MODES,
    NO_DURABILITY,
    Durability,
    DurabilityMode,
    DurabilitySetting,
    Guard,
    Scope,
    WriteNotConfirmed,
    current_scope,
    resolve_durability,
    unconfirmed,
    within,
)

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
    "Scope",
    "WriteNotConfirmed",
    "confirm",
    "confirm_async",
    "confirmed",
    "confirmed_async",
    "current_scope",
    "resolve_durability",
    "settle",
    "settle_async",
    "unconfirmed",
]

# The channel of the read confirmation's PUBLISH (nobody subscribes: only its place in
# the replication stream matters).
CONFIRM_CHANNEL: Final = "vmpool:confirm"


class DurabilitySource(Protocol):
    """Where a client's durability comes from when it follows the group."""

    def current(self) -> Durability: ...

    def close(self) -> None: ...


def _check_confirmation(durability: Durability, replies: Sequence[Any]) -> None:
    """Raise unless ``replies`` (PUBLISH, then :meth:`Durability.queue`'s) confirm."""
    if isinstance(replies[0], Exception):
        raise replies[0]
    scope = current_scope()
    if scope is not None and scope.settles:
        scope.check(durability, replies[1:])
    else:
        durability.check(replies[1:])


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
    """A client whose script calls return only once their durability is confirmed.

    Every state change vmpool makes is a script call (see the module docstring). In a
    unit of work (:func:`confirmed`) a call does not wait: the unit's end does, once.
    :func:`vmpool.state.connection.connect` makes these clients and sets
    :attr:`durability` (or its ``source``).
    """

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:  # type: ignore[override]
        durability = self.durability
        if not durability.waits:
            return super().evalsha(sha, numkeys, *keys_and_args)
        scope = current_scope()
        if scope is not None:
            scope.defer(durability)
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
        """Confirm every write Redis holds now (a unit's writes included), in one round trip.

        Whoever made the writes, on whichever connection: the PUBLISH puts this
        connection's offset past all of them. Before a read is answered as a fact, before
        a side effect outside Redis, and at the end of a unit of work.
        """
        durability = self.durability
        if not durability.waits:
            return
        with self.pipeline(transaction=False) as pipe:
            pipe.publish(CONFIRM_CHANNEL, "")
            durability.queue(pipe)
            replies = pipe.execute(raise_on_error=False)
        _check_confirmation(durability, replies)

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


def settle(client: redis.Redis, decided: int | None = None) -> None:
    """Confirm the unit of work's writes (and reads) so far: before a side effect outside
    Redis that they decided (a provider call).

    Nothing outside a unit (every write waited already), or when nothing is pending.
    ``decided``: the :func:`write_mark` at which the side effect was decided (a create
    claim's, once its locks and clone slots are taken). Nothing either when every write
    before it is confirmed: the writes since are other subjects' (the records of the
    claim's creates before this one), which nothing of this side effect rests on, and the
    unit's end confirms them. So a claim of creates waits once, not once per create.
    """
    scope = current_scope()
    if scope is None or not scope.settles or not scope.pending:
        return
    if decided is not None and scope.confirmed_writes >= decided:
        return
    confirm(client)


def write_mark() -> int | None:
    """The count of the calling unit's writes so far (None outside a unit): where a side
    effect is decided, for its :func:`settle`."""
    scope = current_scope()
    return None if scope is None else scope.writes


async def settle_async(client: aredis.Redis) -> None:
    """:func:`settle` for an asyncio client: the unit's pending writes, confirmed now."""
    scope = current_scope()
    if scope is not None and scope.settles and scope.pending:
        await confirm_async(client)


def _opens_scope(client: redis.Redis | aredis.Redis) -> Scope | None:
    """A new unit for ``client``, or None: a plain client, or inside a unit already."""
    outer = current_scope()
    if not isinstance(client, _Confirming) or (outer is not None and outer.settles):
        return None
    return Scope()


@contextmanager
def confirmed(client: redis.Redis) -> Iterator[None]:
    """A unit of work: its script calls do not wait, and its end confirms them all.

    One PUBLISH and WAIT through ``client`` when something was written, none otherwise;
    :class:`WriteNotConfirmed` when not confirmed. A unit left by an exception is not
    confirmed (nothing of it is acknowledged). Inside a unit already: part of that one.
    Every client of the process, in this context (and the threads it hands it to), joins
    the unit.
    """
    scope = _opens_scope(client)
    if scope is None:
        yield
        return
    with within(scope):
        yield
        if scope.pending:
            confirm(client)


@asynccontextmanager
async def confirmed_async(client: aredis.Redis) -> AsyncIterator[None]:
    """:func:`confirmed` for an asyncio client (its end awaits the confirmation)."""
    scope = _opens_scope(client)
    if scope is None:
        yield
        return
    with within(scope):
        yield
        if scope.pending:
            await confirm_async(client)


def queue_confirmation(
    pipe: redis.client.Pipeline | aredis.client.Pipeline, durability: Durability | None
) -> bool:
    """Queue on ``pipe``, after its writes, what confirms them: True when queued.

    A PUBLISH before the WAIT: every write Redis holds is confirmed, the unit of
    work's so far included, whichever connection made them (its end then has nothing
    left to wait for). Nothing in an :func:`unconfirmed` block or when ``durability``
    waits for nothing.
    """
    scope = current_scope()
    if durability is None or not durability.waits or (scope is not None and not scope.settles):
        return False
    pipe.publish(CONFIRM_CHANNEL, "")
    durability.queue(pipe)
    return True


def check_confirmation(durability: Durability, replies: Sequence[Any]) -> None:
    """Raise unless ``replies`` (of :func:`queue_confirmation`'s commands) confirm."""
    _check_confirmation(durability, replies)


class ConfirmingAsyncRedis(_Confirming, aredis.Redis):  # type: ignore[misc]  # redis-py's own bases
    """The asyncio twin of :class:`ConfirmingRedis`, for the API's hot paths.

    Those paths pipeline their scripts themselves: :func:`vmpool.state.lua.run_pipelined_async`
    queues :func:`queue_confirmation`.
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
        _check_confirmation(durability, replies)

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        self._close_source()
        await super().aclose(close_connection_pool)
