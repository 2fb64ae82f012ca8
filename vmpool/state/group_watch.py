"""What a majority of the sentinels say of the Redis group, kept fresh for a client's writes.

Through Sentinel, a write is kept by a failover only if the replica promoted holds it. Two
facts decide what an acknowledged write must wait for, and both change while a process
runs:

- **Which replicas could be promoted.** The sentinels promote a replica they know, that
  is up, and whose ``replica-priority`` is not 0. A write waits (``WAIT``) until every
  such replica holds it (:meth:`GroupView.must_hold`). Waiting for fewer is not enough:
  in a planned switch (``SENTINEL FAILOVER``) or a partition, the old primary goes on
  taking writes after a replica was promoted, and the replica left behind still follows
  it. ``WAIT 1`` then counts that replica, and the write vanishes when the group
  settles on the new primary.
- **Which server is the primary.** A connection opened to a primary stays open after
  the sentinels promoted another (the old one demoted, or cut off from them). The
  client's connections lead to the primary the last view names, and one open to
  another server reopens there before it sends
  (:class:`vmpool.state.sentinel.FollowingConnection`). A write's count is made for
  that primary, and the write is not acknowledged when, by the time its replies are
  in, a majority of the sentinels name another one (:class:`PinnedPrimary`).

A replica that a majority of the sentinels hold down (subjectively or objectively), and
that the primary has no live link to (online, acknowledged within :data:`LAG_LIMIT_S`),
is not waited for. It holds nothing new, and it cannot be promoted while down. When it
is back it resyncs from the primary before it is counted again. A replica a majority of
the sentinels only have no link to (``disconnected``) is down only when the watch cannot
reach it either (a server gone, not yet held down): the sentinel that promotes a replica
kills that replica's clients as it does (``CLIENT KILL TYPE normal`` and ``pubsub``),
the sentinels' own links among them, so for a moment every sentinel shows the replica
being promoted as disconnected, while the old primary still takes writes that only the
other replica follows: counted as down, it would let ``WAIT 1`` acknowledge writes that
the promotion loses. A replica that the sentinels lost but that still follows the
primary (a partition between the sentinels and part of the group) is waited for: the
sentinels may promote another one meanwhile, and the write must be refused.

:class:`GroupWatch` asks the sentinels (and the primary, for its links) every
:data:`REFRESH_S` seconds in a thread of its own, at once when a write's ``WAIT`` came
short (:meth:`GroupWatch.wake`), and before a command that failed (a demoted primary's
READONLY, a lost connection) is retried (:meth:`GroupWatch.refresh`). A write does not
wait for the sentinels otherwise, except for the first view. Sentinels that cannot be
reached leave the last view in place: no failover can happen without them, and the
count it holds keeps writes safe.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import redis

from vmpool.state.durability import Durability

__all__ = [
    "LAG_LIMIT_S",
    "REFRESH_S",
    "Address",
    "FollowingDurability",
    "GroupView",
    "GroupWatch",
    "ReplicaSeen",
    "read_view",
    "replicas_seen",
]

Address = tuple[str, int]

# How old a view may grow before the sentinels are asked again.
REFRESH_S: Final = 1.0
# A replica whose last acknowledgement is older than this has no live link to the
# primary: Redis's own default for min-replicas-max-lag.
LAG_LIMIT_S: Final = 10
_ERRORS: Final = (redis.ConnectionError, redis.TimeoutError, redis.ResponseError)


@dataclass(frozen=True)
class ReplicaSeen:
    """A replica of the primary as the sentinels that name that primary report it."""

    address: Address
    promotable: bool  # replica-priority is not 0
    down: bool  # a majority of those sentinels hold it down or cannot reach it


@dataclass(frozen=True)
class GroupView:
    """The group as a majority of the sentinels described it at ``at`` (monotonic).

    ``primary`` is None when no majority named one (the sentinels could not be reached,
    or disagree while a failover is under way). ``linked``: the replicas the primary
    itself has online with a recent acknowledgement.
    """

    primary: Address | None
    replicas: tuple[ReplicaSeen, ...] = ()
    linked: frozenset[Address] = frozenset()
    at: float = 0.0

    def promotable(self) -> list[ReplicaSeen]:
        """The replicas the sentinels could promote now or once they are back."""
        return [r for r in self.replicas if r.promotable]

    def must_hold(self) -> int:
        """How many replicas a write waits for: every one the sentinels could promote.

        Not one that is down and has no link to the primary (module docstring). At least
        1 while the sentinels know a promotable replica: a write is never acknowledged by
        the primary alone in a group that can fail over.
        """
        promotable = self.promotable()
        gone = [r for r in promotable if r.down and r.address not in self.linked]
        return max(1, len(promotable) - len(gone)) if promotable else 0


def _address(state: dict[str, Any]) -> Address:
    return str(state["ip"]), int(state["port"])


def _ask(sentinel: redis.Redis, service: str) -> tuple[Address, list[dict[str, Any]]] | None:
    """One sentinel's word: the primary it names (if healthy) and its replicas."""
    try:
        pipe = sentinel.pipeline(transaction=False)
        pipe.sentinel_master(service)
        pipe.sentinel_slaves(service)
        master, replicas = pipe.execute()
    except _ERRORS:
        return None
    if not master.get("is_master") or master.get("is_sdown") or master.get("is_odown"):
        return None
    return _address(master), list(replicas)


def replicas_seen(
    answers: Sequence[list[dict[str, Any]]], reachable: Callable[[Address], bool]
) -> tuple[ReplicaSeen, ...]:
    """The replicas any of ``answers`` lists, and which are down (module docstring).

    Down: a majority of ``answers`` hold it down, or a majority hold it down or have no
    link to it and ``reachable`` says the watch has none either.
    """
    held_down: Counter[Address] = Counter()
    no_link: Counter[Address] = Counter()
    promotable: dict[Address, bool] = {}
    for replicas in answers:
        for state in replicas:
            address = _address(state)
            promotable[address] = promotable.get(address, False) or (
                int(state.get("slave-priority", 100)) != 0
            )
            if state.get("is_sdown") or state.get("is_odown"):
                held_down[address] += 1
            elif state.get("is_disconnected"):
                no_link[address] += 1
    majority = len(answers) // 2

    def down(address: Address) -> bool:
        if held_down[address] > majority:
            return True
        return held_down[address] + no_link[address] > majority and not reachable(address)

    return tuple(
        ReplicaSeen(address, promotable[address], down(address)) for address in sorted(promotable)
    )


def _linked(info: dict[str, Any]) -> frozenset[Address]:
    """The replicas ``INFO replication`` shows online with a recent acknowledgement."""
    out = set()
    for name, value in info.items():
        if not (name.startswith("slave") and isinstance(value, dict)):
            continue
        if value.get("state") == "online" and int(value.get("lag", 0)) <= LAG_LIMIT_S:
            out.add((str(value["ip"]), int(value["port"])))
    return frozenset(out)


def read_view(
    sentinels: Sequence[redis.Redis],
    service: str,
    replication_of: Callable[[Address], dict[str, Any]],
) -> GroupView:
    """Ask every sentinel, and the primary a majority names for its replication links.

    ``replication_of(address)``: that server's ``INFO replication`` (an error leaves
    its links unknown: none); asked of a replica too, whether the watch reaches it, when
    the sentinels have no link to it. A server that says it is a replica is named by no
    view.
    """
    answers = [a for a in (_ask(s, service) for s in sentinels) if a is not None]
    votes = Counter(address for address, _ in answers)
    named = [a for a, n in votes.most_common(1) if n > len(sentinels) // 2]
    if not named:
        return GroupView(primary=None, at=time.monotonic())
    primary = named[0]
    try:
        info = replication_of(primary)
    except _ERRORS:
        info = {}
    if info.get("role") == "slave":  # demoted: the sentinels will say so soon
        return GroupView(primary=None, at=time.monotonic())
    linked = _linked(info)

    def reachable(address: Address) -> bool:
        # Linked: waited for whatever the sentinels say, no need to ask it.
        if address in linked:
            return True
        try:
            replication_of(address)
        except _ERRORS:
            return False
        return True

    replicas = replicas_seen([r for address, r in answers if address == primary], reachable)
    return GroupView(primary, replicas, linked, time.monotonic())


class GroupWatch:
    """A view of the group, refreshed in a thread of its own (module docstring).

    ``read()`` makes a fresh view. The thread holds the watch weakly: it ends when the
    watch is closed or dropped, and starts again in a forked child on first use.
    """

    def __init__(self, read: Callable[[], GroupView], interval_s: float = REFRESH_S) -> None:
        self._read = read
        self.interval_s = interval_s
        self._view: GroupView | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pid = 0
        self.closed = False
        # How many times the primary named changed (to another, not to none): a unit of
        # work's writes all went to one primary only if this did not move meanwhile.
        self.changes = 0
        self._named: Address | None = None

    def current(self) -> GroupView:
        """The last view; made now on first use (the only wait the write path makes)."""
        if self._pid != os.getpid():
            self._start()
        view = self._view
        return view if view is not None else self.refresh()

    def refresh(self) -> GroupView:
        """Ask the sentinels now. A view without a primary keeps the last one's replicas."""
        with self._lock:
            fresh = self._read()
            last = self._view
            if fresh.primary is None and last is not None:
                fresh = GroupView(None, last.replicas, last.linked, fresh.at)
            if fresh.primary is not None and fresh.primary != self._named:
                if self._named is not None:
                    self.changes += 1
                self._named = fresh.primary
            self._view = fresh
        return fresh

    def named_primary(self) -> Address | None:
        """The primary a majority of the sentinels name (None: none did, last time)."""
        return self.current().primary

    def wake(self) -> None:
        """Ask the sentinels again now, in the watch's thread (a WAIT came short)."""
        self._wake.set()

    def close(self) -> None:
        self.closed = True
        self._wake.set()

    def _start(self) -> None:
        """Start the thread: on first use, and in a forked child (which has no thread, and
        whose copy of the lock may be held by the parent's thread at the fork)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        threading.Thread(
            target=_keep_fresh, args=(weakref.ref(self), self._wake, self.interval_s),
            name="vmpool-group-watch", daemon=True,
        ).start()  # fmt: skip


def _keep_fresh(ref: weakref.ref[GroupWatch], wake: threading.Event, interval_s: float) -> None:
    """The watch's thread: a refresh every ``interval_s``, or at once when woken."""
    while True:
        wake.wait(interval_s)
        wake.clear()
        watch = ref()
        if watch is None or watch.closed:
            return
        with contextlib.suppress(Exception):  # a view not refreshed keeps the last one
            watch.refresh()
        del watch


@dataclass(frozen=True)
class FollowingDurability:
    """The confirmations a write through Sentinel waits for, as the group is now.

    ``replicas``: a fixed count (``durability_replicas`` set), or None for every replica
    the sentinels could promote. Each write's :class:`Durability` is pinned to the
    primary its count was made for (:class:`PinnedPrimary`); the client's connections
    lead to that same primary (:class:`vmpool.state.sentinel.FollowingConnection`).
    """

    watch: GroupWatch
    replicas: int | None
    timeout_s: float

    def current(self) -> Durability:
        view = self.watch.current()
        count = view.must_hold() if self.replicas is None else self.replicas
        guard = PinnedPrimary(self.watch, view.primary, self.watch.changes)
        return Durability(count, self.timeout_s, automatic=self.replicas is None, guard=guard)

    def close(self) -> None:
        self.watch.close()


@dataclass(frozen=True)
class PinnedPrimary:
    """A write's guard: the primary it was counted for must still be the one named.

    ``changes``: the watch's count of changes of the primary then. A unit of work's
    writes since its guard was pinned went to one primary only if it did not move.
    """

    watch: GroupWatch
    primary: Address | None
    changes: int = 0

    def refusal(self) -> str | None:
        """Why a write just confirmed must still not be acknowledged, or None."""
        named = self.watch.current().primary
        if self.watch.changes != self.changes and self.primary is not None:
            return f"the primary changed since {_show(self.primary)} took the write"
        if named is None or self.primary is None or named == self.primary:
            return None
        return (
            f"{_show(self.primary)} is no longer the primary a majority of the sentinels"
            f" name ({_show(named)})"
        )

    def shortfall(self) -> None:
        self.watch.wake()


def _show(address: Address) -> str:
    return f"{address[0]}:{address[1]}"
