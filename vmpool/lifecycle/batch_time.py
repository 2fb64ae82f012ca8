"""When a batch job stops: its time is over, or a sweep waits for its worker.

A batch job (:mod:`vmpool.lifecycle.batch`) may run for a second. The worker's dequeue
serves the sweeps first, but only at a dequeue: with every worker in such a job, the
expiry sweep would wait that long, longer than the scheduler's lead
(``workers/schedule.py``: a quarter of the sweep's interval, which absorbs the delay
from a due time to the sweep's run). Its settle bound, TTL plus one sweep interval,
rests on that lead. So a job that has run :data:`SWEEP_POLL_S` asks its dispatcher
whether a sweep waits (one read, at most once per that interval, between two subjects)
and stops if one does. Its continuation is queued behind the sweep.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final

from vmpool.lifecycle.fleet import Dispatcher, SweepWatch

__all__ = ["SWEEP_POLL_S", "BatchTime", "StageTime"]

# How long a batch job runs before it first looks for a waiting sweep, and between two
# looks. Well within the expiry sweep's lead (0.5 s at its 2 s default interval).
SWEEP_POLL_S: Final = 0.05


class BatchTime:
    """The clock of one batch job: its :attr:`deadline` is ``budget`` seconds after its
    start, and it is :meth:`over` earlier once a sweep waits (asked of ``dispatch`` when
    it is a :class:`SweepWatch`). A job shorter than :data:`SWEEP_POLL_S` reads nothing."""

    def __init__(self, dispatch: Dispatcher, budget: float) -> None:
        self.started = time.monotonic()
        self.deadline = self.started + budget  # monotonic: no claim starts after it
        self._watch = dispatch if isinstance(dispatch, SweepWatch) else None
        self._looked = self.started
        self.yielded = False

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def over(self, deadline: float) -> bool:
        """Whether a stage of the job that ends at ``deadline`` (monotonic, at most the
        job's) stops claiming and running subjects now."""
        now = time.monotonic()
        if self.yielded or now >= deadline:
            return True
        if self._watch is None or now - self._looked < SWEEP_POLL_S:
            return False
        self._looked = now
        self.yielded = self._watch.sweep_waiting()
        return self.yielded


@dataclass(frozen=True)
class StageTime:
    """One stage's time in a batch job: over at its own ``deadline`` (monotonic) or when
    the job's ``clock`` is (a sweep seen waiting by any stage stops them all)."""

    clock: BatchTime
    deadline: float

    def over(self) -> bool:
        return self.clock.over(self.deadline)
