"""The fleet-wide on-demand clone limit: a Redis semaphore of leases.

vmpooler counts clones in progress in one process; vmpool has many worker processes on
many machines, so the count lives in Redis: a zset whose members are lease ids and whose
scores are the leases' expiry times (Redis server time).
``vmpool/state/scripts/clone_semaphore.lua`` drops expired leases, then checks the limit
and adds the lease in one atomic unit.

Lease ids are VM names: a slot is taken for a VM when it is reserved
(``lifecycle.provision_request``) and given back when its create finishes, however it
finishes (``lifecycle.create_vm`` releases in a ``finally``; the reconciler and the
failure paths release too). Acquiring again with the id of a live lease renews it, so a
create job that runs twice, or a re-dispatched create, holds one slot, not two. A worker
killed mid-create never releases: its lease expires (``lease_s``, twice the lock
expiry) and the slot comes back by itself. A live create keeps its lease for as long as
its provider call runs, however long that is: ``renewing`` renews it every third of
``lease_s`` (so two renewals may be missed before it lapses), from one thread per
semaphore (so per Fleet, per process) shared by every create.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import redis

from vmpool.state.keys import Keys
from vmpool.state.lua import read_script

__all__ = ["CloneSemaphore"]

log = logging.getLogger(__name__)


# An idle lease keeper thread ends after this long without a lease to renew.
KEEPER_LINGER_S = 30.0


def _script_text() -> str:
    return read_script("vmpool.state.scripts", "clone_semaphore.lua")


class CloneSemaphore:
    """At most ``limit`` live leases fleet-wide, each expiring ``lease_s`` after it was
    taken (or last renewed)."""

    def __init__(self, redis_client: redis.Redis, keys: Keys, limit: int, lease_s: float) -> None:
        if limit < 1:
            raise ValueError(f"clone limit must be at least 1, got {limit}")
        if lease_s <= 0:
            raise ValueError(f"lease time must be positive, got {lease_s}")
        self.redis = redis_client
        self.key = keys.clone_slots
        self.limit = int(limit)
        self.lease_s = float(lease_s)
        self._script = redis_client.register_script(_script_text())
        self._keeper = _LeaseKeeper(self._renew, self.lease_s / 3)

    def acquire(self, holder: str) -> str | None:
        """Take (or renew) the lease ``holder``; its id, or None when all slots are taken."""
        granted = self._script(
            keys=[self.key], args=["acquire", holder, self.limit, repr(self.lease_s)]
        )
        return holder if int(granted) == 1 else None

    def acquire_all(self, holders: Sequence[str]) -> dict[str, bool]:
        """:meth:`acquire` for each of ``holders`` in turn, in one script (a batch
        job's create claim); holder -> whether it holds a lease now."""
        if not holders:
            return {}
        args: list[str | int] = ["acquire_all", self.limit, repr(self.lease_s), *holders]
        granted = self._script(keys=[self.key], args=args)
        return {h: int(g) == 1 for h, g in zip(holders, granted, strict=True)}

    def release(self, lease: str) -> bool:
        """Give the slot back; True if a live lease was dropped (releasing twice is fine)."""
        return int(self._script(keys=[self.key], args=["release", lease])) == 1

    @contextmanager
    def renewing(self, holder: str) -> Iterator[None]:
        """Keep the lease ``holder`` alive while the block runs (a provider call that
        may outlast ``lease_s``): the limit must hold for as long as the clone it
        guards. Renewal is ``acquire`` again: it renews a live lease, and retakes a
        lapsed one only if a slot is free, so it never pushes the count over the limit.
        A lapse (this process paused past the lease) is logged; the caller goes on,
        since the clone is already under way. One thread per semaphore renews every
        block's lease (issue 15: a thread started and joined per create cost more
        than the create's Redis calls); when the block ends its lease is renewed no
        more (an in-flight renewal of it is waited for)."""
        ticket = self._keeper.add(holder)
        try:
            yield
        finally:
            self._keeper.remove(ticket)

    def _renew(self, holder: str) -> None:
        try:
            if self.acquire(holder) is None:
                log.warning("clone slot lease of %s lapsed; no slot free to retake", holder)
        except redis.RedisError as exc:  # the next round retries
            log.warning("clone slot lease of %s not renewed: %s", holder, exc)

    def count(self) -> int:
        """Live leases now (expired ones are dropped first)."""
        return int(self._script(keys=[self.key], args=["count"]))

    def holders(self) -> list[str]:
        """Lease ids currently in the zset (expired ones may still be listed)."""
        return [
            m.decode() if isinstance(m, bytes) else str(m)
            for m in self.redis.zrange(self.key, 0, -1)
        ]


class _LeaseKeeper:
    """One daemon thread calling ``renew(holder)`` for each added ticket every ``every``
    seconds until it is removed. Started on first use; it waits on a condition (no
    Redis traffic) while nothing is added, and ends after :data:`KEEPER_LINGER_S`
    without a ticket. :meth:`remove` returns only once no renewal of its ticket runs,
    so nothing renews a lease after its block ended (its release stays a release)."""

    def __init__(self, renew: Callable[[str], None], every: float) -> None:
        self._renew = renew
        self._every = every
        self._cv = threading.Condition()
        self._due: dict[object, tuple[str, float]] = {}  # ticket -> (holder, next due)
        self._running: set[object] = set()  # tickets being renewed now
        self._thread: threading.Thread | None = None

    def add(self, holder: str) -> object:
        ticket = object()
        with self._cv:
            self._due[ticket] = (holder, time.monotonic() + self._every)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="clone-lease-keeper", daemon=True
                )
                self._thread.start()
            self._cv.notify_all()
        return ticket

    def remove(self, ticket: object) -> None:
        with self._cv:
            self._due.pop(ticket, None)
            while ticket in self._running:
                self._cv.wait()

    def _next(self) -> list[tuple[object, str]] | None:
        """The tickets due now (marked running), or None when the thread should end."""
        with self._cv:
            while True:
                if not self._due:
                    self._cv.wait(KEEPER_LINGER_S)
                    if not self._due:
                        self._thread = None  # add() starts another
                        return None
                    continue
                now = time.monotonic()
                due = [(t, h) for t, (h, at) in self._due.items() if at <= now]
                if due:
                    for ticket, holder in due:
                        self._due[ticket] = (holder, now + self._every)
                        self._running.add(ticket)
                    return due
                self._cv.wait(min(at for _, at in self._due.values()) - now)

    def _run(self) -> None:
        while (due := self._next()) is not None:
            for ticket, holder in due:
                try:
                    self._renew(holder)
                finally:
                    with self._cv:
                        self._running.discard(ticket)
                        self._cv.notify_all()
