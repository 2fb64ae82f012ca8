"""How quick each batch stage has been lately in this worker.

A batch job may run the follow-ups of its claims itself, in the same job, instead of
queueing a batch job for them (:mod:`vmpool.lifecycle.chain`). That
saves a job's whole price, and the wait for a worker, per stage of a VM's way to ready.
It is right only when the follow-up stage is quick: a create that blocks for a minute (a
vSphere clone) run in line would keep the other work this job could hand to other
workers waiting behind it. :class:`StagePace` keeps the time per subject of each stage's
last claims, and says a stage is quick when most of them were: a claim slowed once by a
busy machine (its worker descheduled) does not send the stage back to the queues, a
provider whose creates block does.

One per worker process (the Fleet's ``pace``), read and written by its job thread only.
A stage no claim of this process has run yet takes the fleet's word on it (its
:class:`~vmpool.state.pace_board.PaceBoard`, where each worker posts its verdict when
it changes, read at most every :data:`BOARD_READ_S`): a worker started beside others
that found creates quick runs its creates in line at once. With no word either, a
stage is quick only if it makes no provider call per subject (:data:`QUICK_UNSEEN`):
a fleet's first creates go through the queues as they always did, while its first
checks do not wait in the queue behind the batch jobs that run the creates. A fleet
whose providers all say their creates answer at once
(:class:`~vmpool.providers.base.InstantCreates`) takes creates for quick too
(:func:`quick_unseen`): there is no clone that could block to find out about.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Final

from vmpool.ids import Job
from vmpool.providers.base import InstantCreates, Provider
from vmpool.state.pace_board import PaceBoard

__all__ = ["BOARD_READ_S", "QUICK_S", "QUICK_UNSEEN", "RECENT_CLAIMS", "StagePace", "quick_unseen"]

# The most a stage's claim may take per subject, in each of its last claims, for the
# stage to be run in line (seconds). A create or a status call that answers at once
# takes a few milliseconds; one that waits for a cloud takes hundreds.
QUICK_S: Final = 0.025
# The claims per stage whose pace counts: the stage is quick while more than half of
# them were (their upper median).
RECENT_CLAIMS: Final = 8
# The stages taken for quick before any claim of theirs ran here: a provision claim is
# Redis alone (lending ready VMs included); a check claim asks each provider once for
# all of its VMs. A create calls its provider per VM, and a clone may block for minutes.
QUICK_UNSEEN: Final = frozenset({Job.PROVISION_REQUEST, Job.CHECK_PENDING_VM})
# How often a worker with no verdict of its own on a stage reads the fleet's (seconds): a
# read only while its claims want the stage, and its own first claim ends them.
BOARD_READ_S: Final = 0.1


def quick_unseen(providers: Iterable[Provider]) -> frozenset[Job]:
    """The stages taken for quick before any claim of theirs ran, in a fleet of
    ``providers``: :data:`QUICK_UNSEEN`, and creates if every provider's answer at once."""
    listed = list(providers)
    if listed and all(isinstance(p, InstantCreates) and p.creates_at_once() for p in listed):
        return QUICK_UNSEEN | {Job.CREATE_VM}
    return QUICK_UNSEEN


class StagePace:
    """The time per subject of each stage's last :data:`RECENT_CLAIMS` claims.

    ``board``: the fleet's (None: this worker's claims alone). ``unseen``: the stages
    taken for quick with no word on them (:func:`quick_unseen`). ``clock``: monotonic
    seconds (tests pass their own)."""

    def __init__(
        self,
        quick_s: float = QUICK_S,
        recent: int = RECENT_CLAIMS,
        board: PaceBoard | None = None,
        unseen: frozenset[Job] = QUICK_UNSEEN,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.quick_s = quick_s
        self.unseen = unseen
        self._recent = recent
        self._seconds: dict[Job, deque[float]] = {}
        self._board = board
        self._clock = clock
        self._posted: dict[Job, bool] = {}  # this worker's verdicts the board has
        self._fleet: dict[str, bool] = {}  # the board as last read
        self._read_at = float("-inf")

    def record(self, job: Job, seconds: float, subjects: int) -> None:
        """One claim of ``job`` ran ``subjects`` subjects in ``seconds``; a verdict that
        changed is posted to the board."""
        if subjects <= 0:
            return
        recent = self._seconds.setdefault(job, deque(maxlen=self._recent))
        recent.append(seconds / subjects)
        if self._board is not None:
            verdict = self._verdict(recent)
            if self._posted.get(job) != verdict and self._board.post(job, verdict):
                self._posted[job] = verdict

    def quick(self, job: Job) -> bool:
        """Whether more than half of ``job``'s last claims took at most :attr:`quick_s` a
        subject; with none yet, the fleet's word (the board), else whether it is one of
        :attr:`unseen`."""
        recent = self._seconds.get(job)
        if recent:
            return self._verdict(recent)
        word = self._word(job)
        return job in self.unseen if word is None else word

    def _verdict(self, recent: deque[float]) -> bool:
        return sorted(recent)[len(recent) // 2] <= self.quick_s

    def _word(self, job: Job) -> bool | None:
        """The board's verdict on ``job``, read again at most every :data:`BOARD_READ_S`
        while it has none."""
        if self._board is None:
            return None
        if job not in self._fleet and self._clock() - self._read_at >= BOARD_READ_S:
            self._read_at = self._clock()
            self._fleet = self._board.read()
        return self._fleet.get(job)
