"""The one thread of a process that renews its locks and leases.

Each held lock (:class:`~vmpool.state.locks.FencedLock`) is extended every third of its
expiry by a token-checked script; a batch job's claim (vmpool.lifecycle.claims) is kept
the same way. One daemon thread for all of them, started on first use.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

import redis

from vmpool.state.renewer_sleep import RenewerSleep

__all__ = ["RENEWER_LINGER_S", "LockRenewer", "Renewable"]

log = logging.getLogger(__name__)

# An idle renewer thread ends after this long without a lock.
RENEWER_LINGER_S = 30.0


class Renewable(Protocol):
    """What a :class:`LockRenewer` keeps alive: a lock, or another lease of the process.

    A batch job's claim is one (vmpool.lifecycle.claims).
    """

    key: str

    def renew_every_s(self) -> float:
        """Seconds until the next renewal is due (asked after each one)."""
        ...

    def _renew(self) -> bool:
        """One renewal. False to be renewed no more."""
        ...


class LockRenewer:
    """One daemon thread extending every lock it is given, each every third of its expiry.

    A lock is extended until it is released or found lost. The thread starts on first
    use. It idles (waiting on a condition, no Redis traffic) while no lock is held, and
    ends after :data:`RENEWER_LINGER_S` without any (a process holding locks now and
    then keeps one thread, not one per lock). It keeps any :class:`Renewable` the same
    way.
    """

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._sleep = RenewerSleep(self._cv)
        self._locks: dict[int, tuple[Renewable, float]] = {}
        self._thread: threading.Thread | None = None

    def add(self, lock: Renewable) -> None:
        with self._cv:
            due = time.monotonic() + lock.renew_every_s()
            self._locks[id(lock)] = (lock, due)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lock-renewer", daemon=True)
                self._thread.start()
            self._sleep.added(due)

    def remove(self, lock: Renewable) -> None:
        with self._cv:
            self._locks.pop(id(lock), None)

    def _due(self) -> list[Renewable] | None:
        with self._cv:
            while True:
                if not self._locks:
                    self._sleep.wait(RENEWER_LINGER_S)
                    if not self._locks:
                        self._thread = None  # add() starts another
                        return None
                now = time.monotonic()
                due = [lk for lk, at in self._locks.values() if at <= now]
                if due:
                    for lk in due:
                        self._locks[id(lk)] = (lk, now + lk.renew_every_s())
                    return due
                nxt = min((at for _, at in self._locks.values()), default=None)
                self._sleep.wait(None if nxt is None else nxt - now)

    def _run(self) -> None:
        while (due := self._due()) is not None:
            for lock in due:
                try:
                    if not lock._renew():
                        self.remove(lock)
                except redis.RedisError as exc:  # the next round may land
                    log.warning("lock %s: renewal failed: %s", lock.key, exc)
