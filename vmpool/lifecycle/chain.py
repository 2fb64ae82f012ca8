"""Stages run in line: what the stages one batch job runs share.

A VM's way to ready is three stages, each a batch job: a provision claim reserves VMs
(each takes a clone slot), a create claim creates them (each gives its slot back,
handing the slot's turn to the next request in line), a check claim finds them booted.
Queued, each stage costs a job and the wait for a worker; at the clone limit, the slots
stay held through those waits. So a claim's follow-ups to a stage that has been quick in
this worker are only added to their work set (no job queued) and run by this job right
after the claim, within its time. Those to a stage whose loop is already open in this
job (the turns a create hands back, to the provision loop running it) wait for that
loop's next claim. A stage run in line that stops on time queues a batch job for what it
held back, as a dispatch would have. A worker killed meanwhile leaves them in their work
sets, where the periodic sweeps' dispatch finds them (the bound of a lost job).

The next claim of each stage a claim's follow-ups went to is made ahead, in the round
trip that ends that claim (:meth:`Chain.ahead`; the work-set adds come first in it, so
the claim finds them): the first claim of a stage run in line, and the next claim of a
loop already open (the turns a create hands back: at the clone limit, the next reserve
waits for that claim). One that goes unused (the stage stopped on time first, or the
job failed) is let go at once, its subjects back in line; one that comes back empty is
made again (an add answered NOSCRIPT runs again after the calls that followed it, the
claim among them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.client import Pipeline

from vmpool.ids import Job
from vmpool.lifecycle.batch_time import BatchTime
from vmpool.lifecycle.fleet import Dispatcher, Fleet
from vmpool.lifecycle.pace import StagePace
from vmpool.state.locks import FencedLock, LockKind
from vmpool.state.lua import ScriptCall
from vmpool.state.workset import Claim, WorkSet

__all__ = ["Chain", "Prepare", "Prepared", "Reading", "Stage", "Stages"]


@dataclass(frozen=True)
class Prepared:
    """What a claim's per-claim work did for its granted subjects: each one's extra
    arguments for its step, and ``done``, those whose work it did itself (a create made
    at once, a ready recorded at once). Such a subject's step only goes on from that
    outcome, so it runs even once the stage's time is over: let go, it would be claimed
    and locked again only to find its work done, and what its step hands on (a freed
    slot's turn, its check) would wait for that."""

    extra: dict[str, dict[str, Any]]
    done: frozenset[str] = frozenset()


# Per-claim work done for all granted subjects at once.
Prepare = Callable[[Fleet, list[FencedLock]], Prepared]


@dataclass(frozen=True)
class Reading:
    """Per-claim work that starts from a read of its own, made in the round trip that
    grants the claim's locks (``reads`` queues it on that pipeline; ``prepare`` gets the
    granted locks and its replies)."""

    reads: Callable[[Fleet, Pipeline], None]
    prepare: Callable[[Fleet, list[FencedLock], list[Any]], Prepared]


# A stage: its per-subject job, the step, the lock it runs under, the per-claim work.
Stage = tuple[Job, Callable[..., object], tuple[LockKind, str] | None, Prepare | Reading | None]
# How to run each stage, by its per-subject job: a fresh Stage for each claim.
Stages = Mapping[Job, Callable[[], Stage]]


@dataclass
class Chain:
    """What the stages one batch job runs share."""

    dispatch: Dispatcher  # the fleet's own (the queues)
    clock: BatchTime  # the job's: no claim starts once it is over
    in_line_until: float  # monotonic: no stage is taken in line after it (IN_LINE_S)
    work: WorkSet
    pace: StagePace | None  # None: no stage in line (the queues only)
    stages: Stages  # how to run each stage it may run
    work_lease_s: float  # a claim's lease (batch.lease_s)
    claim_size: int  # a stage's first claim in line (batch.CLAIM_SIZE)
    running: list[Job] = field(default_factory=list)  # the open stage loops, outermost first
    held: dict[Job, set[str]] = field(default_factory=dict)  # added, no job queued for them
    made_ahead: dict[Job, Claim] = field(default_factory=dict)  # next claims made ahead

    def takes(self, job: Job) -> bool:
        """Whether a follow-up to ``job`` stays in this batch job: its loop is open, or
        it is a stage that has been quick, with time left to run it."""
        if self.pace is None or job not in self.stages:
            return False
        if self.clock.yielded or time.monotonic() >= self.in_line_until:
            return False
        return job in self.running or self.pace.quick(job)

    def quick(self, job: Job) -> bool:
        """Whether ``job``'s stage has been quick in this worker (its claims not kept small)."""
        return self.pace is not None and self.pace.quick(job)

    def add_call(self, job: Job, subjects: list[str]) -> ScriptCall:
        """The call that adds ``subjects`` to ``job``'s work set, no job queued: this batch
        job runs them."""
        self.held.setdefault(job, set()).update(subjects)
        return self.work.add_call(job, subjects)

    def ahead(self, jobs: Sequence[Job]) -> list[tuple[Job, str, ScriptCall]]:
        """The next claims of the stages of ``jobs`` (each run in line next, or its loop
        open), as their loop would make them: each its job, id and call."""
        lease = float(self.work_lease_s)
        calls = []
        for job in jobs:
            if job not in self.made_ahead:
                claim_id, call = self.work.claim_call(job, self.claim_size, lease)
                calls.append((job, claim_id, call))
        return calls

    def keep_ahead(self, job: Job, claim_id: str, reply: Any) -> None:
        """Keep a claim made ahead, for its stage's first claim in line."""
        if not isinstance(reply, Exception):
            self.made_ahead[job] = WorkSet.claimed(claim_id, reply)

    def let_go_ahead(self, job: Job | None = None) -> None:
        """Put back in line the subjects of claims made ahead and not used (of ``job``, or
        all): their stage stopped on time before its first claim, or the job failed."""
        for each in [job] if job is not None else list(self.made_ahead):
            claim = self.made_ahead.pop(each, None)
            if claim is not None:
                self.work.release(each, claim, claim.subjects)
