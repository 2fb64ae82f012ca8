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
claim (:class:`DeferredDispatch`), one send per job. A dispatch costs a script of lane
checks (``workers.batching.BatchDispatcher.probe``), which done per VM would be most of a
VM's Redis commands. The claim is marked done only after that dispatch. So a worker
killed in between leaves the claim to be run again (each step is idempotent), and a
subject's follow-up is never lost with it. A follow-up whose dispatch is lost anyway
(Redis gone) is re-found by the periodic sweeps.

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
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from types import MappingProxyType
from typing import Any, Final

from vmpool.ids import Job
from vmpool.lifecycle.batch_time import BatchTime
from vmpool.lifecycle.claims import ClaimKeeper
from vmpool.lifecycle.fleet import Dispatcher, Fleet
from vmpool.lifecycle.outcomes import BatchCount, LockMiss, VMStep
from vmpool.lifecycle.ready import ready_now, record_ready_all
from vmpool.lifecycle.requests import CloneGate, provision_request
from vmpool.lifecycle.vms import check_pending_vm, create_vm
from vmpool.lifecycle.warm import pools_with_ready
from vmpool.providers import ProviderVM, StatusBatch
from vmpool.state.locks import FencedLock, LockKind, acquire_all, release_all
from vmpool.state.transitions import VMState
from vmpool.state.workset import Claim, WorkSet

__all__ = [
    "BATCHED",
    "BATCH_TIME_S",
    "CLAIM_SIZE",
    "DEFERRED",
    "LOCKED_STEPS",
    "DeferredDispatch",
    "check_pending_batch",
    "create_vm_batch",
    "lease_s",
    "provision_batch",
    "retry_s",
    "run_batch",
]

log = logging.getLogger(__name__)

# Subjects claimed per round trip. Small enough that a slow provider call does not keep
# many subjects waiting behind it in one job while other workers idle.
CLAIM_SIZE = 20
# A batch job claims again only within this many seconds of its start.
BATCH_TIME_S = 1.0
# (It also stops when a sweep waits for its worker: vmpool.lifecycle.batch_time.)
# A batch job's first claim, its pace not known yet, by job (CLAIM_SIZE otherwise). A
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


class DeferredDispatch:
    """A Dispatcher that holds one claim's follow-ups and sends them batched.

    It holds what the subjects of one claim send and hands it to ``inner`` at
    :meth:`flush`: one send per job, each subject once, in the order first asked."""

    def __init__(self, inner: Dispatcher) -> None:
        self.inner = inner
        self._held: dict[Job, dict[str, None]] = {}

    def send(self, job: Job, subjects: Sequence[str]) -> None:
        self._held.setdefault(job, {}).update(dict.fromkeys(subjects))

    def flush(self) -> None:
        """Dispatch what is held, one send per job."""
        held, self._held = self._held, {}
        for job, subjects in held.items():
            self.inner.send(job, list(subjects))


# The lock each batched step runs under: the kind of its subject and the step's name
# (the holder id says which step holds it).
LOCKED_STEPS: Final[Mapping[Job, tuple[LockKind, str]]] = MappingProxyType(
    {
        Job.PROVISION_REQUEST: ("request", "provision"),
        Job.CREATE_VM: ("vm", "create"),
        Job.CHECK_PENDING_VM: ("vm", "check_pending"),
    }
)

# Per-claim work done for all granted subjects at once: subject -> extra arguments.
Prepare = Callable[[Fleet, list[FencedLock]], dict[str, dict[str, Any]]]


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

    With ``locked`` (the lock's kind and step, :data:`LOCKED_STEPS`), the locks of a
    claim's subjects are granted in one script (each its own lock and token, read with
    its subject's record) and ``fn(fleet, subject, lock)`` runs for each granted one. A
    subject whose lock another worker holds is 'busy'. The locks are released in one
    script once the claim has run. ``prepare``, given the granted locks, does for those
    subjects at once what each would do alone (the create claim's clone slots) and says
    what to pass each ``fn``. Without ``locked``, ``fn(fleet, subject)`` runs. A
    :class:`~vmpool.lifecycle.claims.ClaimKeeper` keeps the claim while it runs. What
    the subjects dispatch goes out once per claim, after the locks are released and
    before the claim is marked done (:class:`DeferredDispatch`)."""
    clock = BatchTime(fleet.dispatch, BATCH_TIME_S)
    deferred = DeferredDispatch(fleet.dispatch)
    fleet = copy.copy(fleet)  # the same clients, names and renewer. Its own dispatch
    fleet.dispatch = deferred
    work = WorkSet(fleet.redis, fleet.keys)
    counts: Counter[str] = Counter()
    ran = 0
    while True:
        if clock.over():
            counts[BatchCount.MORE] = 1
            return _plain(counts)
        elapsed = clock.elapsed()
        size = FIRST_CLAIM.get(job, CLAIM_SIZE)
        if ran and elapsed > 0:  # what fits in the time left at the pace so far
            size = int((BATCH_TIME_S - elapsed) * ran / elapsed)
        claim = work.claim(job, max(1, min(CLAIM_SIZE, size)), lease_s(fleet))
        if not claim.subjects:
            return _plain(counts)
        done, later = _run_claim(fleet, work, (job, fn, locked, prepare), claim, clock, counts)
        ran += len(done) + len(later)
        work.done(job, claim, done)
        work.defer(job, claim, later, retry_s(fleet))
        work.release(job, claim, [s for s in claim.subjects if s not in {*done, *later}])


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


_How = tuple[Job, Callable[..., object], tuple[LockKind, str] | None, Prepare | None]


def _run_claim(
    fleet: Fleet, work: WorkSet, how: _How, claim: Claim, clock: BatchTime, counts: Counter[str]
) -> tuple[list[str], list[str]]:
    """Run one claim's subjects. Returns those done and those deferred.

    Run the claimed subjects (under their locks, for a locked step) until the batch's
    time is over or a sweep waits. Returns those done and those deferred
    (:data:`DEFERRED`). The claim is kept (renewed, its unstarted subjects let go at the
    batch's end: ClaimKeeper) while it runs. The locks are released and the follow-ups
    dispatched whatever happens."""
    assert isinstance(fleet.dispatch, DeferredDispatch)
    job, fn, locked, prepare = how
    held: dict[str, FencedLock] = {}
    extra: dict[str, dict[str, Any]] = {}
    done: list[str] = []
    later: list[str] = []
    keeper: ClaimKeeper | None = None
    try:
        if locked is not None:
            kind, step = locked
            asked = [fleet.lock(kind, s, step, read_record=True) for s in claim.subjects]
            held = {lock.subject: lock for lock in acquire_all(asked)}
            extra = prepare(fleet, list(held.values())) if prepare and held else {}
        keeper = ClaimKeeper(
            work, job, claim, held, lease_s=lease_s(fleet), deadline=clock.deadline
        )
        fleet.lock_renewer.add(keeper)
        for subject in claim.subjects:
            if (done or later) and clock.over():
                break
            if not keeper.start(subject):
                continue  # let go: another worker runs it
            try:
                outcome = _run_subject(fleet, job, fn, subject, held if locked else None, extra)
            finally:
                keeper.finish()
            counts[outcome] += 1
            (later if outcome in DEFERRED else done).append(subject)
    finally:
        let_go = set()
        if keeper is not None:
            keeper.close()
            fleet.lock_renewer.remove(keeper)
            let_go = set(keeper.let_go)
            if let_go:
                counts[BatchCount.RELEASED] += len(let_go)
        release_all([lock for s, lock in held.items() if s not in let_go])
        fleet.dispatch.flush()
    return done, later


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


def provision_batch(fleet: Fleet) -> dict[str, int]:
    """Run provision_request for every request in its work set.

    provision_request for every request in its work set, in the order of service. Once
    one meets the clone limit, the rest of the batch only take ready VMs
    (:class:`~vmpool.lifecycle.requests.CloneGate`). A claim reads once which pools have
    ready VMs to lend: a request whose pools have none runs no claim script."""
    locked = LOCKED_STEPS[Job.PROVISION_REQUEST]
    step = partial(provision_request, gate=CloneGate())
    return run_batch(fleet, Job.PROVISION_REQUEST, step, locked, _ready_to_lend)


def _ready_to_lend(fleet: Fleet, locks: list[FencedLock]) -> dict[str, dict[str, Any]]:
    """A provision claim's one read of the pools with ready VMs to lend, for each request."""
    ready = pools_with_ready(fleet)
    return {lock.subject: {"ready": ready} for lock in locks}


def create_vm_batch(fleet: Fleet) -> dict[str, int]:
    """create_vm for every reserved VM in its work set."""
    return run_batch(fleet, Job.CREATE_VM, create_vm, LOCKED_STEPS[Job.CREATE_VM], _take_slots)


def _take_slots(fleet: Fleet, locks: list[FencedLock]) -> dict[str, dict[str, Any]]:
    """Take a create claim's clone slots in one script.

    A create claim's clone slots in one script: for each VM still reserved (as read
    under its lock), its lease renewed or a free slot taken, as ``create_vm`` would do
    alone. Each ``create_vm`` is told whether it holds one (and gives it back, as ever).
    A slot taken for a VM the claim does not reach before its time is over is its own:
    its next create uses it, and a lease nobody renews ends by itself."""
    held = [(lk.subject, lk.fence) for lk in locks if lk.record.get("state") == VMState.RESERVED]
    return {name: {"slot": ok} for name, ok in fleet.slots.acquire_all(held).items()}


def check_pending_batch(fleet: Fleet) -> dict[str, int]:
    """check_pending_vm for every booting VM in its work set.

    A claim asks each provider that answers for many at once about all its VMs in one
    call (:func:`_ask_at_once`), not one call per VM."""
    job = Job.CHECK_PENDING_VM
    return run_batch(fleet, job, check_pending_vm, LOCKED_STEPS[job], _ask_at_once)


def _ask_at_once(fleet: Fleet, locks: list[FencedLock]) -> dict[str, dict[str, Any]]:
    """A check claim's one status call per batching provider, for its pending VMs.

    Asked after the locks were granted, as each VM's own check would ask. A provider
    that fails to answer is left out: its VMs ask alone (and count its error). The VMs
    of requests it says booted are recorded ready here, in one store call for the claim
    (:func:`~vmpool.lifecycle.ready.record_ready_all`), under the locks held: each
    one's check then returns its code (``readied``)."""
    names: dict[str, list[str]] = {}
    for lock in locks:
        record = lock.record
        if record.get("state") == VMState.PENDING:
            names.setdefault(record.get("provider", ""), []).append(lock.subject)
    seen: dict[str, Mapping[str, ProviderVM | None]] = {}
    for provider_name, vms in names.items():
        provider = fleet.providers.get(provider_name)
        if isinstance(provider, StatusBatch):
            try:
                seen[provider_name] = provider.statuses(vms)
            except Exception as exc:  # each VM asks alone, as it would have
                log.warning("check_pending: %s did not answer: %s", provider_name, exc)
    if not seen:
        return {}
    booted = [
        ready
        for lock in locks
        for provider_name in [lock.record.get("provider", "")]
        if provider_name in seen
        and (ready := ready_now(lock, provider_name, seen[provider_name].get(lock.subject)))
    ]
    readied = record_ready_all(fleet, booted)
    return {lock.subject: {"seen": seen, "readied": readied.get(lock.subject)} for lock in locks}
