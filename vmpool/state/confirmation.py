"""What a write waits for before vmpool says "done", and the unit of work it may wait in.

The data of :mod:`vmpool.state.durability` (the clients that wait live there):
the setting, the confirmations it resolves to (:class:`Durability`), the refusal
(:class:`WriteNotConfirmed`), and the unit of work whose writes are confirmed together
(:class:`Scope`, in a context variable: the code a unit runs, and the threads it hands
its context to, see it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, get_args

import redis
import redis.asyncio as aredis

__all__ = [
    "DURABILITY_MODES",
    "NO_DURABILITY",
    "Durability",
    "DurabilityMode",
    "DurabilitySetting",
    "Guard",
    "Scope",
    "WriteNotConfirmed",
    "current_scope",
    "resolve_durability",
    "unconfirmed",
    "within",
]

DurabilityMode = Literal["auto", "none", "replicas"]
DURABILITY_MODES: Final[tuple[str, ...]] = get_args(DurabilityMode)
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


@dataclass
class Scope:
    """The writes of one unit of work, confirmed together (see the module docstring).

    ``settles`` False: bookkeeping nothing outside Redis acts on (:func:`unconfirmed`),
    never waited for. ``first``: the durability read at the first write since the last
    confirmation; its guard pins the primary those writes went to. ``pending``: a write
    made since the last confirmation. ``writes``: the unit's writes so far, of which the
    first ``confirmed_writes`` are confirmed (a settle told where its side effect was
    decided skips a wait for the writes after that: :func:`vmpool.state.durability.settle`).
    """

    settles: bool = True
    first: Durability | None = None
    pending: bool = False
    writes: int = 0
    confirmed_writes: int = 0

    def defer(self, durability: Durability) -> None:
        """A write of the unit, left to the unit's confirmation."""
        if self.first is None:
            self.first = durability
        self.pending = True
        self.writes += 1

    def check(self, durability: Durability, replies: Sequence[Any]) -> None:
        """Raise unless ``replies`` (a PUBLISH's WAIT) confirm every write of the unit so far.

        ``durability``: read now. The count is the group's now; the guard of the first
        write refuses as well when the primary changed since it.
        """
        durability.check(replies)
        self.covered()

    def covered(self) -> None:
        """The unit's writes so far, confirmed by a PUBLISH and WAIT sent after them.

        Another unit's confirmation covers them too: the PUBLISH confirms every write
        Redis held. Raises as :meth:`check` does when the primary changed since the first.
        """
        guard = None if self.first is None else self.first.guard
        refusal = None if guard is None else guard.refusal()
        if refusal is not None:
            raise WriteNotConfirmed(f"write not confirmed: {refusal}")
        self.first = None
        self.pending = False
        self.confirmed_writes = self.writes


_SCOPE: ContextVar[Scope | None] = ContextVar("vmpool_durability_scope", default=None)


def current_scope() -> Scope | None:
    """The unit of work the calling code runs in (None: every write waits on its own)."""
    return _SCOPE.get()


@contextmanager
def within(scope: Scope) -> Iterator[Scope]:
    """Run the block in ``scope`` (the calling context's unit of work until it ends)."""
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


@contextmanager
def unconfirmed() -> Iterator[None]:
    """Writes nobody waits for: bookkeeping that nothing outside Redis acts on.

    For the worker's loop (its dequeue, heartbeats and job counters) and the
    scheduler's moves. A failover that loses one runs a job again or late, and every
    job is idempotent. A unit of work opened inside confirms its own writes.
    """
    with within(Scope(settles=False)):
        yield
