"""The one lock scaffold of the lifecycle.

Every job that works under a request's or a VM's fenced lock goes through :func:`locked`
or :func:`run_locked`.

A job either takes the subject's lock itself or adopts one a batch job granted for it
(:mod:`vmpool.lifecycle.batch` grants a claim's locks in one script and releases them
in one). :func:`locked` is the context manager (as Zuul's ``locked()``): it takes the
lock or adopts the one given, and releases only a lock it took. :func:`run_locked` runs
a step under it and turns the two ordinary misses into the step's outcome, with one log
line each: another worker holds the lock (``busy``, debug) or the lock was lost while
the step worked (``lock_lost``, warning). Neither is an error: the periodic sweeps bring
the work back, and the store's fence refuses a stale holder's writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from vmpool.lifecycle.fleet import Fleet
from vmpool.lifecycle.outcomes import LockMiss
from vmpool.state.locks import FencedLock, LockBusy, LockKind, LockLost

__all__ = ["LockMiss", "locked", "run_locked"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# How the log names a subject of each lock kind.
_NOUN: dict[LockKind, str] = {"request": "request", "vm": "VM"}


@contextmanager
def locked(
    fleet: Fleet,
    kind: LockKind,
    subject: str,
    job: str,
    *,
    lock: FencedLock | None = None,
    read_record: bool = False,
) -> Iterator[FencedLock]:
    """Hold the subject's lock for the block.

    ``lock``: already granted (by a batch job, which releases it) and adopted as it is.
    Otherwise the lock is taken here (its grant also reads the subject's record when
    ``read_record``) and released when the block ends. Raises :class:`LockBusy` without
    running the block when another worker holds the lock.
    """
    if lock is not None:
        yield lock
        return
    taken = fleet.lock(kind, subject, job, read_record=read_record)
    if not taken.acquire():
        raise LockBusy(taken.key)
    try:
        yield taken
    finally:
        taken.release()


def run_locked(
    fleet: Fleet,
    kind: LockKind,
    subject: str,
    job: str,
    step: Callable[[FencedLock], T],
    *,
    lock: FencedLock | None = None,
    read_record: bool = False,
) -> T | LockMiss:
    """Run ``step`` under the subject's lock (taken or adopted as by :func:`locked`).

    Returns what ``step`` returns, or :attr:`LockMiss.BUSY` when another worker holds
    the lock, or :attr:`LockMiss.LOCK_LOST` when ``step`` found the lock lost.
    """
    try:
        with locked(fleet, kind, subject, job, lock=lock, read_record=read_record) as held:
            return step(held)
    except LockBusy:
        log.debug("%s %s: another worker holds the %s", job, subject, _NOUN[kind])
        return LockMiss.BUSY
    except LockLost as exc:
        log.warning("%s %s stopped: %s", job, subject, exc)
        return LockMiss.LOCK_LOST
