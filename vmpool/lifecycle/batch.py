"""Batch jobs: one RQ job runs the per-subject work of many subjects.

A job that handles one VM pays RQ's whole price (dequeue, bookkeeping: tens of Redis
commands) for one VM. The dispatcher of a worker fleet (``workers.batching``) therefore
puts the subjects of ``provision_request``, ``create_vm`` and ``check_pending_vm`` into
the job's work set (:mod:`vmpool.state.workset`) and queues a batch job. The batch job
claims them :data:`CLAIM_SIZE` at a time and runs the very same per-subject function for
each (:func:`vmpool.lifecycle.create_vm` etc., unchanged). So:

- each subject's change is still its own checked transition under its own lock
- the clone limit is still the semaphore's
- a subject is still deduplicated: the set holds it once, and its lock and transitions
  refuse a second runner.

A worker killed mid-batch loses nothing. Its claimed subjects stay in the set and are
claimed again when the lease (:func:`lease_s`) ends, and the periodic sweeps re-dispatch
any work.

The follow-up work a subject's step dispatches (the create of a reserved VM, the check
of a created one, a destroy) is collected while a claim runs. It is dispatched once per
claim, one send per job, at the claim's end (:mod:`vmpool.lifecycle.deferred`): the
claim's locks released, then its follow-ups dispatched, then its subjects marked done,
in one round trip when its follow-ups all stay in the batch job. So a worker killed in
between leaves the claim to be run again (each step is idempotent), and a subject's
follow-up is never lost with it. A follow-up whose dispatch is lost anyway (Redis gone)
is re-found by the periodic sweeps.

Each batch function loops until the set has nothing claimable or it has run for
:data:`BATCH_TIME_S`. It then returns the count of each outcome, with ``more: 1`` when it
stopped on time with work left. The job's entry point then queues its continuation
(``workers.batching.BatchDispatcher.continue_batch``) at the back of the queue, so a long
backlog never holds a worker away from the sweeps. The worker's dequeue serves the sweeps
first only at a dequeue, and the expiry sweep's settle bound needs workers to come back
to the queues: a job also stops early once a sweep waits
(:mod:`vmpool.lifecycle.batch_time`).
"""

from __future__ import annotations

import copy
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, Final

import redis

from vmpool.ids import Job
from vmpool.lifecycle.batch_time import BatchTime, StageTime
from vmpool.lifecycle.chain import Ahead, Chain, Prepare, Stage, Stages, grant_claim
from vmpool.lifecycle.claims import ClaimKeeper
from vmpool.lifecycle.deferred import DeferredDispatch, end_claim
from vmpool.lifecycle.fleet import Fleet
from vmpool.lifecycle.outcomes import BatchCount, LockMiss, VMStep
from vmpool.state.locks import FencedLock, LockKind
from vmpool.state.lua import ScriptCall
from vmpool.state.workset import WorkSet

__all__ = [
    "BATCHED",
    "BATCH_TIME_S",
    "CLAIM_SIZE",
    "DEFERRED",
    "Stage",
    "Stages",
    "lease_s",
    "retry_s",
    "run_batch",
    "run_stages",
]

log = logging.getLogger(__name__)

# Subjects claimed per round trip. Small enough that a slow provider call does not keep
# many subjects waiting behind it in one job while other workers idle.
CLAIM_SIZE = 20
# A batch job claims again only within this many seconds of its start (batch_time.py).
BATCH_TIME_S = 1.0
# A batch job runs follow-up stages in line only within this many seconds of its start;
# after it they are queued, so the jobs of the other queue's lanes get the worker about
# as often as when each stage was a job of its own (a waiting sweep stops it at once).
IN_LINE_S = 0.25
# A batch job's first claim of a stage not known to be quick in this worker
# (StagePace), by job (CLAIM_SIZE otherwise). A
# claim's creates run one after the other, and a provider's create may block (a clone):
# a first claim of every create in the set would keep the other reserved VMs, and their
# clone slots, idle behind it while other workers idle. The claims after it are sized
# by the pace, so creates that return at once are still claimed many at a time.
FIRST_CLAIM: Final[Mapping[Job, int]] = MappingProxyType({Job.CREATE_VM: 1})

# The per-subject job each batch job runs, by batch job.
BATCHED: Final[Mapping[Job, Job]] = MappingProxyType(
    {
        Job.PROVISION_BATCH: Job.PROVISION_REQUEST,
        Job.CREATE_VM_BATCH: Job.CREATE_VM,
        Job.CHECK_PENDING_BATCH: Job.CHECK_PENDING_VM,
    }
)


def lease_s(fleet: Fleet) -> float:
    """How long a claim is its job's alone.

    The lock expiry (so a dead worker's subjects come back about when its locks do). A
    claim outliving it lets a second job try the subject, which its lock and checked
    transitions make harmless."""
    return float(fleet.config.lock_expire_s)


def run_batch(
    fleet: Fleet,
    job: Job,
    fn: Callable[..., object],
    locked: tuple[LockKind, str] | None = None,
    prepare: Prepare | None = None,
) -> dict[str, int]:
    """Run ``fn`` for the subjects of ``job``'s work set, a claim at a time.

    Subjects are claimed in the order of service until none is claimable ('more'
    absent) or :data:`BATCH_TIME_S` is over or a sweep waits (:class:`BatchTime`; 'more':
    1, and those not yet run go back in line at once). A claim is sized to what fits in
    the time left at the pace so far (1 to :data:`CLAIM_SIZE`). An exception of one
    subject is logged and counted ('error'). The subject is done (the sweeps re-find
    real work). A subject not over (:data:`DEFERRED`) stays in the set, back in line
    after a lease (the pending sweep then has a batch job queued for it).

    With ``locked`` (the lock's kind and step, as in
    :data:`~vmpool.lifecycle.stages.LOCKED_STEPS`), the locks of a claim's subjects are
    granted in one script (each its own lock and token, read with its subject's record)
    and ``fn(fleet, subject, lock)`` runs for each granted one. A
    subject whose lock another worker holds is 'busy'. The locks are released in one
    script once the claim has run. ``prepare``, given the granted locks, does for those
    subjects at once what each would do alone (the create claim's clone slots) and says
    what to pass each ``fn``. Without ``locked``, ``fn(fleet, subject)`` runs. A
    :class:`~vmpool.lifecycle.claims.ClaimKeeper` keeps the claim while it runs. What
    the subjects dispatch goes out once per claim, after the locks are released and
    before the claim is marked done (:class:`DeferredDispatch`).

    With a ``fleet.pace`` (a worker's), the follow-ups of a claim to a stage that has
    been quick (:class:`~vmpool.lifecycle.pace.StagePace`) are run in line, in this
    job, within its time (:func:`_run_stage`)."""
    how: Stage = (job, fn, locked, prepare)
    return run_stages(fleet, job, {job: lambda: how})


def run_stages(fleet: Fleet, job: Job, stages: Stages) -> dict[str, int]:
    """Run the batch job of stage ``job`` (run_batch), the others of ``stages`` in line."""
    work = WorkSet(fleet.redis, fleet.keys)
    clock = BatchTime(fleet.dispatch, BATCH_TIME_S)
    in_line_until = clock.started + IN_LINE_S
    chain = Chain(
        fleet.dispatch,
        clock,
        in_line_until,
        work,
        fleet.pace,
        stages,
        lease_s(fleet),
        CLAIM_SIZE,
        fleet,
    )
    try:
        return _plain(_run_stage(fleet, job, chain))
    finally:
        try:
            chain.let_go_ahead()
        except redis.RedisError as exc:  # their lease brings them back; keep the job's error
            log.warning("claims made ahead not let go: %s", exc)


def _run_stage(fleet: Fleet, job: Job, chain: Chain, in_line: bool = False) -> Counter[str]:
    """One stage's claim loop (run_batch), its quick follow-up stages run in line.

    ``in_line``: a follow-up stage run in line. Its loop ends once it has claimed what
    this job held back for it (other subjects of its set have their own jobs queued), and
    its first claim is not kept small (:data:`FIRST_CLAIM`): the stage is quick. Nor is
    a batch job's first claim of a stage that has been quick in this worker."""
    make = chain.stages[job]
    deadline = chain.in_line_until if in_line else chain.clock.deadline
    until = StageTime(chain.clock, deadline)
    deferred = DeferredDispatch(chain.dispatch, chain)
    staged = copy.copy(fleet)  # the same clients, names and renewer. Its own dispatch
    staged.dispatch = deferred
    work = chain.work
    counts: Counter[str] = Counter()
    started = time.monotonic()
    ran = 0
    claimed: set[str] = set()
    chain.running.append(job)
    try:
        while True:
            if until.over():
                counts[BatchCount.MORE] = 1
                return counts
            now = time.monotonic()
            size = CLAIM_SIZE if in_line or chain.quick(job) else FIRST_CLAIM.get(job, CLAIM_SIZE)
            if ran and now > started:  # what fits in the time left at the pace so far
                size = int((deadline - now) * ran / (now - started))
            made = chain.next_claim(job, max(1, min(CLAIM_SIZE, size)))
            claim = made.claim
            if not claim.subjects:
                return counts
            how = make()  # per claim: slots may have come back since its gate closed
            done, later, let_go = _run_claim(staged, work, how, made, until, counts)
            ran += len(done) + len(later)
            if fleet.pace is not None:
                fleet.pace.record(job, time.monotonic() - now, len(done) + len(later))
            chain.held.get(job, set()).difference_update(done)  # gone: not to be queued
            _run_in_line(fleet, deferred.here, chain, counts)
            if let_go:  # its time ran out mid-claim: those let go are queued (MORE)
                counts[BatchCount.MORE] = 1
                return counts
            claimed.update(claim.subjects)
            if in_line and chain.held.get(job, set()) <= claimed:
                return counts
    finally:
        chain.running.pop()


def _run_in_line(
    fleet: Fleet, here: dict[Job, list[str]], chain: Chain, counts: Counter[str]
) -> None:
    """Run the stages a claim's follow-ups went to in line."""
    for job in list(here):
        if job in chain.running:
            continue  # its open loop claims them next
        nested = _run_stage(fleet, job, chain, in_line=True)
        chain.let_go_ahead(job)  # not used: the stage stopped on time before its claim
        counts.update({f"{job}:{code}": n for code, n in nested.items()})
        held = chain.held.pop(job, set())
        if nested.get(BatchCount.MORE):  # queue what this job held back, as a send does
            chain.dispatch.send(job, sorted(held))
    here.clear()


# Outcomes of a subject whose work is not over: it stays in its work set, back in line
# after retry_s. Either no clone slot was free, or another worker holds its lock or took
# it over meanwhile (the lock lost, a write refused as stale). Kept in the set, the
# subject is not lost if that worker stops. (A create its provider holds back, 'circuit_open' or
# 'quota', is left to the pending sweep, which dispatches it once the hold is over.)
DEFERRED: frozenset[str] = frozenset(
    {LockMiss.BUSY, LockMiss.LOCK_LOST, VMStep.STALE_FENCE, VMStep.THROTTLED}
)


def retry_s(fleet: Fleet) -> float:
    """How long a deferred subject waits before it is back in line.

    A pending-sweep tick (the sweep then has a batch job queued for it), at least 0.5 s,
    at most a claim's lease (a holder that stopped has lost its lock by then)."""
    return min(lease_s(fleet), max(0.5, fleet.config.schedule.check_pending_sweep))


def _run_claim(
    fleet: Fleet, work: WorkSet, how: Stage, made: Ahead, until: StageTime, counts: Counter[str]
) -> tuple[list[str], list[str], list[str]]:
    """Run one claim's subjects. Returns those done, those deferred and those let go.

    Run the claimed subjects (under their locks, for a locked step) until the stage's
    time is over, those whose work the claim did (``Prepared.done``) even then.
    Done, deferred (:data:`DEFERRED`: back in line after :func:`retry_s`) and let go
    (not run: back in line at once) are ended so in the work set. ``made``: the claim,
    what was granted and read ahead for it (:func:`~vmpool.lifecycle.chain.grant_claim`).
    A ClaimKeeper keeps the claim while it runs. The locks are released and the
    follow-ups dispatched whatever happens (:func:`~vmpool.lifecycle.deferred.end_claim`)."""
    assert isinstance(fleet.dispatch, DeferredDispatch)
    job, fn, locked, prepare = how
    claim = made.claim
    held: dict[str, FencedLock] = {}
    extra: dict[str, dict[str, Any]] = {}
    settled: frozenset[str] = frozenset()  # their work done by the claim: run whatever the time
    done: list[str] = []
    later: list[str] = []
    let_go: list[str] = []
    ends: list[ScriptCall] = []  # the subjects' ends, once all ran
    keeper: ClaimKeeper | None = None
    try:
        if locked is not None:
            held, prepared = grant_claim(fleet, locked, made, prepare)
            extra, settled = prepared.extra, prepared.done
        keeper = ClaimKeeper(work, job, claim, held, lease_s(fleet), until.deadline, settled)
        fleet.lock_renewer.add(keeper)
        for subject in claim.subjects:
            if (done or later) and subject not in settled and until.over():
                continue  # out of time: let go (but a subject whose work its claim did)
            if not keeper.start(subject):
                continue  # let go: another worker runs it
            try:
                outcome = _run_subject(fleet, job, fn, subject, held if locked else None, extra)
            finally:
                keeper.finish()
            counts[outcome] += 1
            (later if outcome in DEFERRED else done).append(subject)
        let_go = [s for s in claim.subjects if s not in {*done, *later}]
        ends = work.end_calls(job, claim, done, later, let_go, retry_s(fleet))
    finally:
        end_claim(fleet.dispatch, work, fleet.lock_renewer, keeper, held, ends, counts)
    return done, later, let_go


def _run_subject(
    fleet: Fleet,
    job: Job,
    fn: Callable[..., object],
    subject: str,
    held: dict[str, FencedLock] | None,
    extra: dict[str, dict[str, Any]],
) -> str:
    """Run one subject's step. Its outcome code.

    One subject's step: ``fn(fleet, subject)`` (no lock), 'busy' (its lock is held
    elsewhere) or ``fn(fleet, subject, lock, **extra)``."""
    if held is None:
        return _run_one(job, subject, partial(fn, fleet, subject))
    if subject not in held:
        return LockMiss.BUSY
    return _run_one(
        job, subject, partial(fn, fleet, subject, held[subject], **extra.get(subject, {}))
    )


def _run_one(job: Job, subject: str, call: Callable[[], object]) -> str:
    try:
        outcome = call()
    except Exception:
        log.exception("%s %s failed in a batch", job, subject)
        return BatchCount.ERROR
    return outcome if isinstance(outcome, str) else BatchCount.DONE


def _plain(counts: Counter[str]) -> dict[str, int]:
    """The counts keyed by plain strings (a code's value, not its enum member)."""
    return {str(code): n for code, n in counts.items()}
