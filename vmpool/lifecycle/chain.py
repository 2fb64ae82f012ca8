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
waits for that claim). In the same round trip the follow-ups' own locks are granted
for the stage that takes them (the create of the VMs just reserved, the check of
those just created; not the provision stage, whose read of the lending pools goes
with its grant): its claim then asks only the locks of subjects it got beyond them,
and releases those it did not get. So a stage run in line costs neither a claim's nor
a grant's round trip. One made ahead that goes unused (the stage stopped on time
first, or the job failed) is let go at once, its subjects back in line and its locks
released; one that comes back empty is made again (an add answered NOSCRIPT runs
again after the calls that followed it, the claim among them; a grant that found a
lock not yet released so leaves it to be asked again).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import redis
from redis.client import Pipeline

from vmpool.ids import Job
from vmpool.lifecycle.batch_time import BatchTime
from vmpool.lifecycle.fleet import Dispatcher, Fleet
from vmpool.lifecycle.pace import StagePace
from vmpool.state.locks import (
    FencedLock,
    LockKind,
    acquire_all_reading,
    grant_call,
    release_all,
    take_granted,
)
from vmpool.state.lua import ScriptCall
from vmpool.state.workset import Claim, WorkSet

__all__ = [
    "Ahead",
    "Chain",
    "Prepare",
    "Prepared",
    "Reading",
    "Stage",
    "Stages",
    "grant_claim",
    "release_granted",
]

log = logging.getLogger(__name__)


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
    lock: Callable[[LockKind, str, str], FencedLock]  # a subject's lock (Fleet.lock), reading
    running: list[Job] = field(default_factory=list)  # the open stage loops, outermost first
    held: dict[Job, set[str]] = field(default_factory=dict)  # added, no job queued for them
    made_ahead: dict[Job, Ahead] = field(default_factory=dict)  # next claims made ahead
    _asked: dict[Job, list[FencedLock]] = field(
        default_factory=dict, init=False, repr=False
    )  # the locks ahead asked, by job, until keep_ahead has the grant's reply

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

    def ahead(self, here: Mapping[Job, Sequence[str]]) -> list[tuple[Job, str, list[ScriptCall]]]:
        """The next claims of the stages ``here`` went to (each run in line next, or its
        loop open), as their loop would make them, each with the grant of its follow-ups'
        locks when the stage takes them ahead (:meth:`_locks_ahead`): each its job,
        claim id and calls."""
        lease = float(self.work_lease_s)
        made = []
        for job, subjects in here.items():
            if job in self.made_ahead:
                continue
            claim_id, call = self.work.claim_call(job, self.claim_size, lease)
            locks = self._locks_ahead(job, subjects)
            self._asked[job] = locks
            made.append((job, claim_id, [call, *([grant_call(locks)] if locks else [])]))
        return made

    def _locks_ahead(self, job: Job, subjects: Sequence[str]) -> list[FencedLock]:
        """The locks of ``subjects`` (``job``'s follow-ups) to grant with its claim made
        ahead, as its claim would ask them: none for a stage not run under locks, or whose
        per-claim work reads in its grant's round trip (a :class:`Reading`)."""
        make = self.stages.get(job)
        if make is None or not subjects:
            return []
        _, _, locked, prepare = make()
        if locked is None or isinstance(prepare, Reading):
            return []
        kind, step = locked
        return [self.lock(kind, subject, step) for subject in dict.fromkeys(subjects)]

    def keep_ahead(self, job: Job, claim_id: str, replies: Sequence[Any]) -> None:
        """Keep a claim made ahead, with the locks granted with it, for its stage's next
        claim. Locks granted with a claim that failed are released at once."""
        locks = self._asked.pop(job, [])
        granted: list[FencedLock] = []
        if locks:
            try:
                granted = take_granted(locks, replies[1])
            except redis.RedisError:  # not granted: the claim grants its own
                granted = []
        if isinstance(replies[0], Exception):
            release_granted(granted)
            return
        claim = WorkSet.claimed(claim_id, replies[0])
        self.made_ahead[job] = Ahead(claim, {lock.subject: lock for lock in granted})

    def next_claim(self, job: Job, size: int) -> tuple[Claim, dict[str, FencedLock]]:
        """``job``'s next claim, and the locks granted ahead with it by subject: the claim
        made ahead, or one of ``size`` made now when none was or it came back empty (it
        may have run before the add of what it was made for: a call answered NOSCRIPT
        runs again after those that followed it). The locks are released when the claim
        is empty or cannot be made."""
        ahead = self.made_ahead.pop(job, None)
        granted = ahead.granted if ahead is not None else {}
        try:
            claim = ahead.claim if ahead is not None else None
            if claim is None or not claim.subjects:
                claim = self.work.claim(job, size, float(self.work_lease_s))
        except BaseException:
            release_granted(list(granted.values()))
            raise
        if not claim.subjects:
            release_granted(list(granted.values()))
            return claim, {}
        return claim, granted

    def let_go_ahead(self, job: Job | None = None) -> None:
        """Put back in line the subjects of claims made ahead and not used (of ``job``, or
        all), the locks granted with them released: their stage stopped on time before
        its next claim, or the job failed."""
        for each in [job] if job is not None else list(self.made_ahead):
            ahead = self.made_ahead.pop(each, None)
            if ahead is not None:
                release_granted(list(ahead.granted.values()))
                self.work.release(each, ahead.claim, ahead.claim.subjects)


@dataclass
class Ahead:
    """A stage's next claim made ahead (:meth:`Chain.ahead`), and the locks of the
    follow-ups that went to it granted in the same round trip, by subject."""

    claim: Claim
    granted: dict[str, FencedLock] = field(default_factory=dict)


def release_granted(locks: list[FencedLock]) -> None:
    """Release ``locks``, granted and not used; one that cannot be is left to its expiry."""
    if not locks:
        return
    try:
        release_all(locks)
    except redis.RedisError as exc:
        log.warning("locks granted ahead not released (they expire): %s", exc)


def grant_claim(
    fleet: Fleet,
    locked: tuple[LockKind, str],
    subjects: list[str],
    prepare: Prepare | Reading | None,
    ahead: dict[str, FencedLock],
) -> tuple[dict[str, FencedLock], Prepared]:
    """Grant a claim's locks (``locked``: their kind and step; one script, the
    ``Reading``'s read in its round trip), but those granted ahead (``ahead``, by
    subject), then its per-claim work for the granted: the held locks by subject, and
    what the work did.

    A lock granted ahead for a subject the claim did not get is released. A ``Reading``
    stage is never granted ahead (its read goes with its grant); its locks are all
    asked here."""
    held: dict[str, FencedLock] = {}
    try:
        if isinstance(prepare, Reading):
            release_granted(list(ahead.values()))
            ahead = {}
        held = {s: ahead.pop(s) for s in subjects if s in ahead}
        release_granted(list(ahead.values()))
        kind, step = locked
        asked = [fleet.lock(kind, s, step, read_record=True) for s in subjects if s not in held]
        replies: list[Any] = []
        if asked:
            reads = partial(prepare.reads, fleet) if isinstance(prepare, Reading) else None
            granted, replies = acquire_all_reading(asked, reads)
            held.update((lock.subject, lock) for lock in granted)
        ordered = [held[s] for s in subjects if s in held]
        held = {lock.subject: lock for lock in ordered}
        if not held or prepare is None:
            return held, Prepared({})
        if isinstance(prepare, Reading):
            return held, prepare.prepare(fleet, ordered, replies)
        return held, prepare(fleet, ordered)
    except BaseException:  # the claim never holds them: let them go, not renewed on
        release_granted([*held.values(), *ahead.values()])
        raise
