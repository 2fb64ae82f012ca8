"""The one way to put vmpool work on RQ: :func:`enqueue` (and its batch form).

The jobs, their queues and their ids come from the job table (:mod:`workers.table`).
The queue names and RQ keys come from :class:`vmpool.state.keys.Keys`, under the fleet's key
prefix. Queues (``<prefix>-<short>``): ``sweeps`` (the periodic jobs), ``requests``
(per request), ``vms`` (per VM).

A worker listens to the sweeps, the requests and the VMs. The sweeps first, whenever
one waits: only a handful are ever queued (at most one waiting run per kind,
workers/schedule.py) and each is short, so they cannot starve the others. So the expiry
sweep, on which invariant 4's settle bound rests, is never stuck behind a flood of
other jobs. In the chaos soak a provision-sweep after a Redis restart queued a hundred
provision jobs, and with the requests first the expiry sweep waited 7 s. The request
jobs and the VM jobs (the bulk of the work) take weighted turns (workers/turns.py), so
a new request starts however long the VM backlog, and a VM's create is not held back by
a backlog of provisioning.

Job ids are deterministic (:func:`workers.table.job_id`). Every job is enqueued as
``Queue.enqueue(..., unique=True)`` enqueues it, through RQ's unique-enqueue script
(:func:`push_unique`): while a job of that id exists (queued or running) a second
enqueue is refused, and :func:`enqueue` returns ``False``.
``result_ttl=0`` deletes the job hash as soon as it succeeds, so the next enqueue of the
same (job, subject) goes through. A failed job keeps its hash for :data:`FAILURE_TTL`
seconds only.

A job hash that outlives its run would block its (job, subject) for as long as RQ takes
to notice (about a minute for a killed worker). :func:`enqueue` therefore *reclaims* a
duplicate that is plainly dead, in one Lua script: a ``failed``/``stopped``/``canceled``
job, or a ``queued`` or ``started`` job whose vmpool heartbeat is older than
:data:`STALE_AFTER_SECONDS`. A vmpool worker pops a job and stamps that heartbeat on
its hash in one script (:mod:`workers.dequeue`, ``pop_job.lua``), then beats every
:data:`HEARTBEAT_SECONDS` (Redis server time) while it runs it. So a ``queued`` hash
with a stale beat was popped by a worker that was killed, or lost the reply with its
connection, before it marked the job started (RQ never runs or expires such a hash:
without this its id would be blocked forever), and a ``queued`` hash without a beat is
still in its queue. Every check is O(1) in the queue's length (an LPOS over the queue
would make a warm sweep of 10,000 VMs cost seconds of Redis time).
The hash is deleted and the enqueue retried once. A paused
process that resumes after its job was reclaimed may run beside the new copy or delete
its hash when it finishes (``result_ttl=0``). Both are harmless because every job is
idempotent and the periodic sweeps re-find any work a lost job leaves behind.

:func:`enqueue_many` is the batched form the sweeps use. A subject its kind's validator
(:mod:`vmpool.ids`) refuses is skipped, logged and counted (``record_skipped``), never
fatal to the batch. The sweeps feed it ids read back from Redis, and one record an older
release let in (``poison\n``, which RQ refuses as a job id) once made every provision
sweep raise and queue nothing, for every request. Otherwise it has the same guarantees
(same ids, same job hash, ``unique``, the same reclaim). It needs a constant number of
round trips per :data:`ENQUEUE_CHUNK` subjects instead of several per subject. The
reclaim script runs for every id in ONE non-transactional pipeline (it answers "free"
for an absent or plainly dead job, deleting the dead hash, and "live" otherwise). Then
each free job is built as RQ builds it and RQ's own unique-enqueue Lua script
(``rq.scripts``) runs for all of them in a second pipeline (RQ's private names it takes
are behind :mod:`workers.rqcompat`). Each script is still its own atomic unit (a pipeline
is not a transaction), so the per-job uniqueness is RQ's. A live duplicate costs one
cheap script and no job building. Each pipeline is one round trip: its scripts go as
bare EVALSHA, loaded only when the server lacks them (``execute_loading``), not after
the SCRIPT EXISTS redis-py's pipeline sends first.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

import redis
from redis.client import Pipeline
from rq import Queue
from rq.scripts import UNIQUE_ENQUEUE_SCRIPT

from vmpool.ids import Job, shown, validate
from vmpool.state.counters import record_skipped
from vmpool.state.keys import Keys
from vmpool.state.lua import evalsha_on, execute_loading, read_script
from workers.rqcompat import push_unique_job
from workers.table import QUEUE_SWEEPS, QUEUES, JobSpec, job_id, queue_names, spec_of

__all__ = [
    "ENQUEUE_CHUNK",
    "FAILURE_TTL",
    "HEARTBEAT_FIELD",
    "HEARTBEAT_SECONDS",
    "RECLAIM_LUA",
    "RUN_WAIT_TTL",
    "STALE_AFTER_SECONDS",
    "RQDispatcher",
    "enqueue",
    "enqueue_ids",
    "enqueue_many",
    "push_unique",
    "queue_names",
    "resolve_queue_names",
    "valid_subjects",
    "wake_workers",
]

log = logging.getLogger(__name__)

# A failed job's hash (and so its block on re-enqueue) lives this long. The traceback is
# in the worker's log. Reclaiming in enqueue() makes even this a soft limit.
FAILURE_TTL: Final = 10
# A scheduled run's hash expires if it waits this long in its queue without starting
# (RQ persists the hash when a worker starts the job). Every run has its own id, so the
# reclaim above never meets a run's id twice. Without this, a run popped by a worker
# killed before it started would leave its 'queued' hash behind forever.
RUN_WAIT_TTL: Final = 600
# The process running a job refreshes HEARTBEAT_FIELD on the job hash this often ...
HEARTBEAT_SECONDS: Final = 2.0
HEARTBEAT_FIELD: Final = "vmpool_heartbeat"
# ... and a started job whose heartbeat is older than this is taken for dead.
STALE_AFTER_SECONDS: Final = 10.0
# enqueue_many sends at most this many jobs per pipeline (bounds one request's size and
# the time the server spends on one batch: 500 scripts run in a few ms).
ENQUEUE_CHUNK: Final = 500


def resolve_queue_names(keys: Keys, names: str | None) -> list[str]:
    """``--queues`` text as the fleet's RQ queue names, in listening order.

    The text: comma-separated short or full names (``vms`` or ``<prefix>-vms``).
    """
    if not names or not names.strip():
        return queue_names(keys)
    out: list[str] = []
    for raw in names.split(","):
        name = raw.strip()
        if not name:
            continue
        short = name.removeprefix(keys.queue(""))
        if short not in QUEUES:
            raise ValueError(f"unknown queue {name!r}; one of: {', '.join(QUEUES)}")
        if keys.queue(short) not in out:
            out.append(keys.queue(short))
    if not out:
        raise ValueError("no queue named")
    return out


# Deletes the hash of a duplicate job that is plainly dead (keys, args, returns and the
# invariant in the script's header).
RECLAIM_LUA: Final = read_script("workers", "reclaim_job.lua")


def _reclaim(conn: redis.Redis, keys: Keys, jid: str) -> bool:
    script = conn.register_script(RECLAIM_LUA)
    return bool(
        script(
            keys=[keys.rq_job(jid)],
            args=[HEARTBEAT_FIELD, STALE_AFTER_SECONDS],
        )
    )


def enqueue(
    conn: redis.Redis,
    keys: Keys,
    job: Job,
    subject: str | None = None,
    *,
    run: int | None = None,
) -> bool:
    """Put ``job`` for ``subject`` on its queue. False when a live copy already exists.

    ``conn`` is a bytes client (``decode_responses=False``), as RQ requires. ``keys``
    names the fleet (queue names and job ids carry its prefix). Raises ValueError for an
    unknown job or a missing/extra/invalid subject. ``run``: see
    :func:`workers.table.job_id`.
    """
    spec = spec_of(job)
    if spec.subject is not None and subject is not None:
        validate(spec.subject, subject)  # InvalidIdentifier, a ValueError
    jid = job_id(keys, job, subject, run=run)
    args = () if subject is None else (subject,)
    ttl = None if run is None else RUN_WAIT_TTL
    for attempt in range(2):
        if push_unique(conn, keys, spec, [(jid, args)], ttl=ttl)[0]:
            return True
        if attempt or not _reclaim(conn, keys, jid):
            return False
    return False


def enqueue_many(
    conn: redis.Redis,
    keys: Keys,
    job: Job,
    subjects: Sequence[str],
    *,
    chunk: int = ENQUEUE_CHUNK,
) -> int:
    """:func:`enqueue` for many subjects of one job. Returns how many were newly queued.

    The same guarantees as :func:`enqueue` (deterministic ids, at most one live copy per
    id, ``result_ttl=0``, :data:`FAILURE_TTL`, the job's timeout, a plainly dead
    duplicate reclaimed and queued) in a constant number of round trips per ``chunk``
    subjects: two pipelines (see the module docstring). A subject given twice is queued once.
    A subject that is no valid name of its kind is skipped (logged once, counted), and
    the others are queued. An unknown job, or one without a subject, raises ValueError.
    """
    spec = spec_of(job)
    if spec.subject is None:
        raise ValueError(f"job {job!r} takes no subject; use enqueue()")
    if chunk < 1:
        raise ValueError("chunk must be >= 1")
    jobs = [(job_id(keys, job, s), (s,)) for s in valid_subjects(conn, keys, spec, subjects)]
    return sum(
        enqueue_ids(conn, keys, spec, jobs[start : start + chunk])
        for start in range(0, len(jobs), chunk)
    )


def enqueue_ids(
    conn: redis.Redis,
    keys: Keys,
    spec: JobSpec,
    jobs: Sequence[tuple[str, tuple[str, ...]]],
    *,
    ttl: int | None = None,
) -> int:
    """Queue each (job id, args) of ``spec`` unless a live copy exists. How many were queued.

    Two pipelines: the reclaim script for every id, then :func:`push_unique` for the free
    ones. ``ttl``: as :func:`push_unique`'s.
    """
    if not jobs:
        return 0
    # Reclaim first: the script answers "free" for an absent or plainly dead job
    # (deleting the dead hash) and "live" otherwise, so the live duplicates (the usual
    # case when workers are behind) cost no job building at all. A copy that appears
    # between the two pipelines is fresh and live: the push refuses it.
    reclaim = conn.register_script(RECLAIM_LUA)

    def reclaim_all(pipe: Pipeline) -> None:
        for jid, _ in jobs:
            evalsha_on(pipe, reclaim, [keys.rq_job(jid)], [HEARTBEAT_FIELD, STALE_AFTER_SECONDS])

    replies = execute_loading(conn, reclaim_all, [reclaim])
    free = [item for item, ok in zip(jobs, replies, strict=True) if ok]
    return sum(push_unique(conn, keys, spec, free, ttl=ttl)) if free else 0


def valid_subjects(
    conn: redis.Redis, keys: Keys, spec: JobSpec, subjects: Sequence[str]
) -> list[str]:
    """The subjects that are valid names of ``spec``'s kind, each once, first one first.

    Each invalid one is skipped and counted. Each distinct one is logged once, shown
    bounded and escaped (the input may be anything a client or an old record held).
    """
    assert spec.subject is not None
    if isinstance(subjects, str):  # a str is a Sequence[str] too: one name is not many
        raise TypeError(f"{spec.name}: subjects are a sequence of names, got {shown(subjects)}")
    valid: dict[str, None] = {}
    logged: set[str] = set()
    skipped = 0
    for subject in subjects:
        try:
            valid[validate(spec.subject, subject)] = None
        except ValueError:
            skipped += 1
            if shown(subject) not in logged:
                logged.add(shown(subject))
                log.warning(
                    "%s: skipped %s: not a valid %s name", spec.name, shown(subject), spec.subject
                )
    if skipped:
        record_skipped(conn, keys, spec.name, "bad_subject", skipped)
    return list(valid)


def push_unique(
    conn: redis.Redis,
    keys: Keys,
    spec: JobSpec,
    jobs: Sequence[tuple[str, tuple[str, ...]]],
    *,
    ttl: int | None = None,
) -> list[bool]:
    """Queue each (job id, args) of ``spec`` as ``Queue.enqueue(..., unique=True)`` does.

    Each job is built as RQ builds it and RQ's unique-enqueue script runs for all of them
    in one non-transactional pipeline (:func:`workers.rqcompat.push_unique_job`).
    ``ttl``: how long a job may wait in its queue (None: forever). Returns, per job,
    whether it was queued (False: a live duplicate).
    """
    queue = Queue(keys.queue(spec.queue), connection=conn)
    push = conn.register_script(UNIQUE_ENQUEUE_SCRIPT)

    def push_all(pipe: Pipeline) -> None:
        pipe.sadd(queue.redis_queues_keys, queue.key)  # what enqueue_job does first
        for jid, args in jobs:
            job = queue.create_job(
                spec.func,
                args=args,
                job_id=jid,
                result_ttl=0,
                failure_ttl=FAILURE_TTL,
                timeout=spec.timeout,
                description=jid,
                ttl=ttl,
            )
            push_unique_job(pipe, push, queue, job)
        wake_workers(pipe, queue.key)  # after the pushes: the woken worker's pop finds them

    return [bool(ok) for ok in execute_loading(conn, push_all, [push])[1 : 1 + len(jobs)]]


def wake_workers(pipe: Pipeline, queue_key: str) -> None:
    """Queue on ``pipe`` a wake-up token for the workers blocked on ``queue_key``.

    Its wake-up list holds at most one (workers/dequeue.py).
    """
    wake = Keys.rq_queue_wake(queue_key)
    pipe.rpush(wake, "1")
    pipe.ltrim(wake, -1, -1)


class RQDispatcher:
    """vmpool.lifecycle's Dispatcher: each follow-up step becomes a deduplicated RQ job.

    A refused duplicate is not an error: the copy already queued (or running) will do
    the work, and the periodic sweeps re-find anything a lost job leaves behind.
    """

    def __init__(self, conn: redis.Redis, keys: Keys, serves_sweeps: bool = True) -> None:
        self.conn = conn
        self.keys = keys
        # Whether the worker it sends for takes the sweeps: only then do its batch jobs
        # stop for a waiting one (a worker of other queues would stop for nothing).
        self.serves_sweeps = serves_sweeps

    def send(self, job: Job, subjects: Sequence[str]) -> None:
        """:func:`enqueue_many`: a constant number of round trips per ENQUEUE_CHUNK."""
        enqueue_many(self.conn, self.keys, job, subjects)

    def sweep_waiting(self) -> bool:
        """Whether a job waits in the sweeps' queue for this worker (vmpool.lifecycle's
        SweepWatch): never for a worker that does not take them."""
        return self.serves_sweeps and bool(self.conn.llen(self.keys.rq_queue(QUEUE_SWEEPS)))
