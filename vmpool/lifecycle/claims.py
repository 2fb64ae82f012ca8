"""A batch job's claim while it runs: renewed, and let go of what it cannot reach.

A batch job (:mod:`vmpool.lifecycle.batch`) claims up to 20 subjects of a work set and
takes their locks in one script, then runs them one after the other. Two things must
not depend on how long one of them takes (a cloud create retries for up to a minute):

- **The claim's lease is renewed while the claim works**, for the subject running and
  those still to run, so no second batch job takes a subject in flight (it would find
  it busy) and the first job's end of its claim still finds its subjects.
- **One slow subject does not hold the others.** Once the batch's time is over
  (``deadline``), the subjects not yet started are let go at once: their locks
  released, and back in line in the work set, so another worker runs them while the
  slow one goes on.

:class:`ClaimKeeper` does both from the process's one renewal thread (the Fleet's
``LockRenewer``, which keeps the locks too): no thread per claim. The job's thread asks
:meth:`ClaimKeeper.start` before each subject. A subject let go is not started.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from vmpool.ids import Job
from vmpool.state.locks import FencedLock, release_all
from vmpool.state.workset import Claim, WorkSet

__all__ = ["ClaimKeeper"]

# Shortest wait between two visits of the renewal thread (a deadline a moment away).
_MIN_PERIOD_S = 0.02


class ClaimKeeper:
    """Keeps a batch job's claim: renews its lease, lets go of what it cannot reach.

    Keeps ``claim`` of ``job`` (subjects in the order they are run) for its batch job:
    renews its lease (``lease_s``) every third of it, and at ``deadline`` (monotonic)
    lets go of the subjects not started, but those whose work the claim did
    (``done_by_claim``). A :class:`~vmpool.state.lock_renewer.Renewable`."""

    def __init__(
        self,
        work: WorkSet,
        job: Job,
        claim: Claim,
        locks: Mapping[str, FencedLock],
        lease_s: float,
        deadline: float,
        done_by_claim: frozenset[str] = frozenset(),
    ) -> None:
        self.key = f"claim {claim.id} of {job}"
        self._work, self._job, self._claim = work, job, claim
        self._locks = dict(locks)
        self._lease_s = lease_s
        self._deadline = deadline
        self._done_by_claim = done_by_claim  # run whatever the time: never let go
        self._mutex = threading.Lock()  # held for a whole renewal, its Redis calls too
        self._waiting = list(claim.subjects)
        self._running: str | None = None
        self._closed = False
        self.let_go: list[str] = []

    def start(self, subject: str) -> bool:
        """Before running ``subject``: False if it was let go (not to be run)."""
        with self._mutex:
            if self._closed or subject not in self._waiting:
                return False
            self._waiting.remove(subject)
            self._running = subject
            return True

    def finish(self) -> None:
        """After running the subject last started."""
        with self._mutex:
            self._running = None

    def close(self) -> None:
        """The claim is over: renewed no more (a renewal under way is waited for)."""
        with self._mutex:
            self._closed = True

    def renew_every_s(self) -> float:
        left = self._deadline - time.monotonic()
        period = self._lease_s / 3
        if 0 < left < period and self._waiting:
            period = left
        return max(_MIN_PERIOD_S, period)

    def _renew(self) -> bool:
        with self._mutex:
            if self._closed:
                return False
            if self._waiting and time.monotonic() >= self._deadline:
                # out of the list first: if Redis fails midway, none of them is started
                # (their locks and claims then run out by themselves)
                let_go = [s for s in self._waiting if s not in self._done_by_claim]
                self._waiting = [s for s in self._waiting if s in self._done_by_claim]
                self.let_go.extend(let_go)
                if let_go:
                    self._let_go(let_go)
            keep = [*([self._running] if self._running else []), *self._waiting]
            if keep:
                self._work.renew(self._job, self._claim, keep, self._lease_s)
            return True

    def _let_go(self, subjects: list[str]) -> None:
        release_all([self._locks[s] for s in subjects if s in self._locks])
        self._work.release(self._job, self._claim, subjects)
