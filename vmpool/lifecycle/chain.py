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
those just created): its claim then asks only the locks of subjects it got beyond
them, and releases those it did not get. The provision stage reads the lending pools
with its grant, so its locks are not granted with the follow-ups; a provision claim
made ahead has them granted, with that read, on the next claim's end, once its
subjects are known (the check claim's, between a create claim and the reserves
after it); a claim that got a subject not granted so asks them all again with the
read. So a stage run in line costs neither a claim's nor a grant's round trip. One
made ahead that goes unused (the stage stopped on time first, or the job failed) is
let go at once, its subjects back in line and its locks released; one that comes back
empty is made again (an add answered NOSCRIPT runs again after the calls that
followed it, the claim among them; a grant that found a lock not yet released so
leaves it to be asked again).
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


# Plain reads queued on a round trip's pipeline (a Reading's, bound to its fleet).
_Reads = Callable[[Pipeline], None]
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
    fleet: Fleet  # the job's (its locks and reads ahead)
    running: list[Job] = field(default_factory=list)  # the open stage loops, outermost first
    held: dict[Job, set[str]] = field(default_factory=dict)  # added, no job queued for them
    made_ahead: dict[Job, Ahead] = field(default_factory=dict)  # next claims made ahead

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

    def ahead(self, here: Mapping[Job, Sequence[str]]) -> AheadRound:
        """What the end of a claim runs for the stages next in line: the next claims of
        the stages ``here`` (each stage's follow-ups) went to, each with the grant of its
        follow-ups' locks unless a :class:`Reading`; and the grant of the locks of each
        claim made ahead before and granted none yet, with its ``Reading``'s read (the
        provision loop's, made on a create claim's end, on the check claim's end)."""
        lease = float(self.work_lease_s)
        # Per job: its claim's id (None: a grant for a claim made before), the locks
        # asked, its calls' count, its read (None: none).
        plan: list[tuple[Job, str | None, list[FencedLock], int, _Reads | None]] = []
        calls: list[ScriptCall] = []
        for job, subjects in here.items():
            if job in self.made_ahead:
                continue
            claim_id, call = self.work.claim_call(job, self.claim_size, lease)
            locks, _ = self._grant_of(job, subjects, reading=False)
            mine = [call, *([grant_call(locks)] if locks else [])]
            plan.append((job, claim_id, locks, len(mine), None))
            calls += mine
        for job, made in self.made_ahead.items():
            if made.asked or not made.claim.subjects:
                continue
            made.asked = True
            locks, reads = self._grant_of(job, made.claim.subjects, reading=True)
            if locks:
                plan.append((job, None, locks, 1, reads))
                calls.append(grant_call(locks))
        counts: list[int] = []  # each read's replies, in plan order

        def read_all(pipe: Pipeline) -> None:
            for *_, reads in plan:
                if reads is not None:
                    before = len(pipe.command_stack)
                    reads(pipe)
                    counts.append(len(pipe.command_stack) - before)

        def keep(replies: Sequence[Any], read_replies: Sequence[Any]) -> None:
            at = read_at = 0
            for job, claim_id, locks, took, reads in plan:
                self._keep(job, claim_id, locks, replies[at : at + took])
                at += took
                if reads is not None:
                    read = counts.pop(0)
                    if job in self.made_ahead:
                        self.made_ahead[job].reads = list(read_replies[read_at : read_at + read])
                    read_at += read

        any_reads = any(reads is not None for *_, reads in plan)
        return AheadRound(calls, read_all if any_reads else None, keep)

    def _grant_of(
        self, job: Job, subjects: Sequence[str], *, reading: bool
    ) -> tuple[list[FencedLock], _Reads | None]:
        """The locks of ``subjects`` as ``job``'s claim asks them, and the read its stage
        makes with its grant (a :class:`Reading`'s). None for a stage not run under
        locks; none for a ``Reading`` stage unless ``reading``."""
        make = self.stages.get(job)
        if make is None or not subjects:
            return [], None
        _, _, locked, prepare = make()
        if locked is None or (isinstance(prepare, Reading) and not reading):
            return [], None
        kind, step = locked
        lock = self.fleet.lock
        locks = [lock(kind, subject, step, read_record=True) for subject in dict.fromkeys(subjects)]
        reads = partial(prepare.reads, self.fleet) if isinstance(prepare, Reading) else None
        return locks, reads

    def _keep(
        self, job: Job, claim_id: str | None, locks: list[FencedLock], replies: Sequence[Any]
    ) -> None:
        """Keep what :meth:`ahead` made for ``job``: a claim (``claim_id``; its reply
        first) with the grant of ``locks`` after it, or (None) the grant of a claim's
        locks made ahead before. Locks granted with a claim that failed are released."""
        granted: list[FencedLock] = []
        if locks:
            try:
                granted = take_granted(locks, replies[-1])
            except redis.RedisError:  # not granted: the claim grants its own
                granted = []
        if claim_id is None:
            made = self.made_ahead.get(job)
            if made is None:  # let go meanwhile (cannot happen in one round trip)
                release_granted(granted)
            else:
                made.granted.update((lock.subject, lock) for lock in granted)
            return
        if isinstance(replies[0], Exception):
            release_granted(granted)
            return
        claim = WorkSet.claimed(claim_id, replies[0])
        self.made_ahead[job] = Ahead(claim, {lock.subject: lock for lock in granted}, bool(locks))

    def next_claim(self, job: Job, size: int) -> Ahead:
        """``job``'s next claim, with what was granted and read ahead for it: the claim
        made ahead, or one of ``size`` made now when none was or it came back empty (it
        may have run before the add of what it was made for: a call answered NOSCRIPT
        runs again after those that followed it). The locks are released when the claim
        is empty or cannot be made."""
        made = self.made_ahead.pop(job, None)
        granted = made.granted if made is not None else {}
        try:
            if made is None or not made.claim.subjects:
                claim = self.work.claim(job, size, float(self.work_lease_s))
                made = Ahead(claim, granted, True)
        except BaseException:
            release_granted(list(granted.values()))
            raise
        if not made.claim.subjects:
            release_granted(list(granted.values()))
            made.granted = {}
        return made

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
    """A stage's next claim made ahead (:meth:`Chain.ahead`) and what was done for it
    ahead: the locks granted, by subject (its follow-ups', in its own round trip, or its
    subjects', in a later one), and its ``Reading``'s read (their replies), if made."""

    claim: Claim
    granted: dict[str, FencedLock] = field(default_factory=dict)
    asked: bool = False  # its locks asked ahead (not again)
    reads: list[Any] | None = None


@dataclass(frozen=True)
class AheadRound:
    """What a claim's end runs for the stages next in line (:meth:`Chain.ahead`): its
    calls, the reads queued after them, and ``keep`` (the calls' and the reads'
    replies), which keeps what they made."""

    calls: list[ScriptCall]
    reads: Callable[[Pipeline], None] | None
    keep: Callable[[Sequence[Any], Sequence[Any]], None]


def release_granted(locks: list[FencedLock]) -> None:
    """Release ``locks``, granted and not used; one that cannot be is left to its expiry."""
    if not locks:
        return
    try:
        release_all(locks)
    except redis.RedisError as exc:
        log.warning("locks granted ahead not released (they expire): %s", exc)


def grant_claim(
    fleet: Fleet, locked: tuple[LockKind, str], made: Ahead, prepare: Prepare | Reading | None
) -> tuple[dict[str, FencedLock], Prepared]:
    """Grant the locks of claim ``made`` (``locked``: their kind and step; one script,
    the ``Reading``'s read in its round trip) but those granted ahead for it, then its
    per-claim work for the granted: the held locks by subject, and what the work did.

    A lock granted ahead for a subject the claim did not get is released. A ``Reading``
    stage uses what was granted and read ahead only when it was all its subjects' locks
    and its read (the read goes with the grant); else its locks are all asked here."""
    subjects = made.claim.subjects
    ahead = made.granted
    held: dict[str, FencedLock] = {}
    try:
        replies = made.reads if isinstance(prepare, Reading) else None
        if isinstance(prepare, Reading) and (replies is None or not ahead.keys() >= {*subjects}):
            release_granted(list(ahead.values()))
            ahead, replies = {}, None
        held = {s: ahead.pop(s) for s in subjects if s in ahead}
        release_granted(list(ahead.values()))
        ahead = {}  # released: not again if what follows raises
        kind, step = locked
        asked = [fleet.lock(kind, s, step, read_record=True) for s in subjects if s not in held]
        if asked:
            reads = partial(prepare.reads, fleet) if isinstance(prepare, Reading) else None
            granted, replies = acquire_all_reading(asked, reads)
            held.update((lock.subject, lock) for lock in granted)
        ordered = [held[s] for s in subjects if s in held]
        held = {lock.subject: lock for lock in ordered}
        if not held or prepare is None:
            return held, Prepared({})
        if isinstance(prepare, Reading):
            return held, prepare.prepare(fleet, ordered, replies or [])
        return held, prepare(fleet, ordered)
    except BaseException:  # the claim never holds them: let them go, not renewed on
        release_granted([*held.values(), *ahead.values()])
        raise
