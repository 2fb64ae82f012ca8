"""Queues, job ids and the one way to put vmpool work on RQ: :func:`enqueue`.

Queues (RQ list keys ``rq:queue:<name>``; one Redis database serves one vmpool fleet):

=================  =========================================================  ==========
queue              jobs                                                       subject
=================  =========================================================  ==========
``vmpool-requests`` ``provision``, ``check-request``                          request id
``vmpool-sweeps``   ``sweep``, ``provision-sweep``, ``check-pending-sweep``,  none
                    ``reap``, ``destroy-sweep``, ``reconcile``
``vmpool-vms``      ``create-vm``, ``check-pending``, ``destroy``             VM name
=================  =========================================================  ==========

A worker listens to the sweeps first, then the requests, then the VMs (RQ dequeues by
strict priority). The sweeps first: only a handful are ever queued (at most one waiting
run per kind, workers/schedule.py) and each is short, so they cannot starve the others,
and the expiry sweep, on which CONTRACT.md's settle bound rests, is never stuck behind
a flood of other jobs (in the chaos soak a provision-sweep after a Redis restart queued
a hundred provision jobs, and with the requests first the expiry sweep waited 7 s).
Then the request jobs, so a new request starts however long the VM backlog; then the
VM jobs, the bulk of the work.

Job ids are deterministic: ``<job>`` for a sweep (``<job>_r<n>`` for a scheduled run),
``<job>-<subject>`` otherwise. RQ ids
allow only ``[A-Za-z0-9_-]``; VM names already fit, request ids may also contain ``.``,
so a subject is encoded injectively: ``_`` -> ``__``, ``.`` -> ``_-`` (a uuid4 is left as
it is). Every job is enqueued with ``unique=True``: while a job of that id exists
(queued or running) a second enqueue raises ``DuplicateJobError``, which :func:`enqueue`
turns into ``False``. ``result_ttl=0`` deletes the job hash as soon as it succeeds, so
the next enqueue of the same (job, subject) goes through; a failed job keeps its hash
for :data:`FAILURE_TTL` seconds only.

A job hash that outlives its run would block its (job, subject) for as long as RQ takes
to notice (about a minute for a killed worker). :func:`enqueue` therefore *reclaims* a
duplicate that is plainly dead, in one Lua script: a ``failed``/``stopped``/``canceled``
job, a ``queued`` job that is in no queue (a worker popped it with BLPOP and was killed,
or lost the reply with its connection, before it marked the job started: RQ never runs
or expires such a hash, so without this its id would be blocked forever), or a
``started`` job whose vmpool heartbeat (written every
:data:`HEARTBEAT_SECONDS` by the process running it, in Redis server time) is older than
:data:`STALE_AFTER_SECONDS`. The hash is deleted and the enqueue retried once. A paused
process that resumes after its job was reclaimed may run beside the new copy or delete
its hash when it finishes (``result_ttl=0``); both are harmless because every job is
idempotent and the periodic sweeps re-find any work a lost job leaves behind.

:func:`enqueue_many` is the batched form the sweeps use, with the same guarantees (same
ids, same job hash, ``unique``, the same reclaim), in a constant number of round trips
per :data:`ENQUEUE_CHUNK` subjects instead of several per subject: the reclaim script
runs for every id in ONE non-transactional pipeline (it answers "free" for an absent or
plainly dead job, deleting the dead hash, and "live" otherwise); then each free job is
built as RQ builds it and RQ's own unique-enqueue Lua script (``rq.scripts``) runs for
all of them in a second pipeline. Each script is still its own atomic unit (a pipeline
is not a transaction), so the per-job uniqueness is RQ's; a live duplicate costs one
cheap script and no job building.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import redis
from redis.commands.core import Script
from rq import Queue
from rq.exceptions import DuplicateJobError
from rq.job import Job
from rq.scripts import UNIQUE_ENQUEUE_SCRIPT, _build_hset_args

from vmpool.state.lua import read_script

__all__ = [
    "ENQUEUE_CHUNK",
    "FAILURE_TTL",
    "HEARTBEAT_FIELD",
    "HEARTBEAT_SECONDS",
    "JOBS",
    "QUEUES",
    "QUEUE_REQUESTS",
    "QUEUE_SWEEPS",
    "QUEUE_VMS",
    "RUN_WAIT_TTL",
    "STALE_AFTER_SECONDS",
    "JobSpec",
    "RQDispatcher",
    "decode_subject",
    "encode_subject",
    "enqueue",
    "enqueue_many",
    "job_id",
    "resolve_queue_names",
]

QUEUE_REQUESTS: Final = "vmpool-requests"
QUEUE_SWEEPS: Final = "vmpool-sweeps"
QUEUE_VMS: Final = "vmpool-vms"
# The order a worker listens in (strict priority, see the module docstring).
QUEUES: Final[tuple[str, ...]] = (QUEUE_SWEEPS, QUEUE_REQUESTS, QUEUE_VMS)  # by priority

# A failed job's hash (and so its block on re-enqueue) lives this long; the traceback is
# in the worker's log. Reclaiming in enqueue() makes even this a soft limit.
FAILURE_TTL: Final = 10
# A scheduled run's hash expires if it waits this long in its queue without starting
# (RQ persists the hash when a worker starts the job). Every run has its own id, so the
# reclaim above never meets a run's id twice; without this, a run popped by a worker
# killed before it started would leave its 'queued' hash behind forever.
RUN_WAIT_TTL: Final = 600
# The process running a job refreshes HEARTBEAT_FIELD on the job hash this often ...
HEARTBEAT_SECONDS: Final = 2.0
HEARTBEAT_FIELD: Final = "vmpool_heartbeat"
# ... and a started job whose heartbeat is older than this is taken for dead.
STALE_AFTER_SECONDS: Final = 10.0
# enqueue_many sends at most this many jobs per pipeline (bounds one request's size and
# the time the server spends on one batch; 500 scripts run in a few ms).
ENQUEUE_CHUNK: Final = 500


@dataclass(frozen=True)
class JobSpec:
    name: str
    func: str  # dotted path, imported by the worker only
    queue: str
    subject: str | None  # "request" | "vm" | None
    timeout: int  # seconds; RQ's hard limit for one run


def _spec(name: str, func: str, queue: str, subject: str | None, timeout: int) -> JobSpec:
    return JobSpec(name, f"workers.jobs.{func}", queue, subject, timeout)


JOBS: Final[dict[str, JobSpec]] = {
    s.name: s
    for s in (
        _spec("provision", "provision_request", QUEUE_REQUESTS, "request", 120),
        _spec("check-request", "check_request", QUEUE_REQUESTS, "request", 120),
        _spec("create-vm", "create_vm", QUEUE_VMS, "vm", 600),
        _spec("check-pending", "check_pending_vm", QUEUE_VMS, "vm", 120),
        _spec("destroy", "destroy_vm", QUEUE_VMS, "vm", 600),
        _spec("sweep", "sweep_expired", QUEUE_SWEEPS, None, 300),
        _spec("provision-sweep", "provision_sweep", QUEUE_SWEEPS, None, 300),
        _spec("check-pending-sweep", "check_pending_sweep", QUEUE_SWEEPS, None, 300),
        _spec("reap", "reap_running", QUEUE_SWEEPS, None, 300),
        _spec("destroy-sweep", "destroy_sweep", QUEUE_SWEEPS, None, 300),
        _spec("reconcile", "reconcile", QUEUE_SWEEPS, None, 600),
    )
}

_SUBJECT_RE: Final = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
_ENCODED_RE: Final = re.compile(r"^(?:[A-Za-z0-9-]|__|_-)+$")


def encode_subject(subject: str) -> str:
    """A request id or VM name as a fragment of an RQ job id (injective)."""
    if not isinstance(subject, str) or not _SUBJECT_RE.match(subject):
        raise ValueError(f"not a request id or VM name: {subject!r}")
    return subject.replace("_", "__").replace(".", "_-")


def decode_subject(encoded: str) -> str:
    """The inverse of :func:`encode_subject`."""
    if not _ENCODED_RE.match(encoded):
        raise ValueError(f"not an encoded subject: {encoded!r}")
    out: list[str] = []
    i = 0
    while i < len(encoded):
        ch = encoded[i]
        if ch == "_":
            out.append("_" if encoded[i + 1] == "_" else ".")
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def job_id(job: str, subject: str | None = None, *, run: int | None = None) -> str:
    """The deterministic RQ job id of ``job`` for ``subject``.

    ``run`` (periodic jobs only) numbers one scheduled run: ``<job>_r<run>``. The
    scheduler gives each due time its own id, so a run frozen or killed mid-way (its hash
    still ``started``) does not hold the id of the next one (workers/schedule.py). In an
    encoded subject every ``_`` is followed by ``_`` or ``-``, never by ``r``, so these
    ids collide with no other.
    """
    spec = _lookup(job)
    if spec.subject is None:
        if subject is not None:
            raise ValueError(f"job {job!r} takes no subject")
        if run is None:
            return spec.name
        if isinstance(run, bool) or not isinstance(run, int) or run < 0:
            raise ValueError(f"a run number is a non-negative integer, got {run!r}")
        return f"{spec.name}_r{run}"
    if run is not None:
        raise ValueError(f"job {job!r} is not periodic: no run number")
    if subject is None:
        raise ValueError(f"job {job!r} needs a {spec.subject} subject")
    return f"{spec.name}-{encode_subject(subject)}"


def _lookup(job: str) -> JobSpec:
    try:
        return JOBS[job]
    except KeyError:
        raise ValueError(f"unknown job {job!r}; one of: {', '.join(JOBS)}") from None


def resolve_queue_names(names: str | None) -> list[str]:
    """``--queues`` text (comma-separated; ``vms`` or ``vmpool-vms``) as queue names."""
    if not names or not names.strip():
        return list(QUEUES)
    out: list[str] = []
    for raw in names.split(","):
        name = raw.strip()
        if not name:
            continue
        full = name if name.startswith("vmpool-") else f"vmpool-{name}"
        if full not in QUEUES:
            raise ValueError(f"unknown queue {name!r}; one of: {', '.join(QUEUES)}")
        if full not in out:
            out.append(full)
    if not out:
        raise ValueError("no queue named")
    return out


# Deletes the hash of a duplicate job that is plainly dead (keys, args, returns and the
# invariant in the script's header).
_RECLAIM_LUA: Final = read_script("workers", "reclaim_job.lua")


def _reclaim(conn: redis.Redis, queue: Queue, jid: str) -> bool:
    script = conn.register_script(_RECLAIM_LUA)
    key = Queue.job_class.key_for(jid)
    return bool(
        script(keys=[key, queue.key], args=[HEARTBEAT_FIELD, STALE_AFTER_SECONDS, jid])
    )


def enqueue(
    conn: redis.Redis, job: str, subject: str | None = None, *, run: int | None = None
) -> bool:
    """Put ``job`` for ``subject`` on its queue; False when a live copy already exists.

    ``conn`` is a bytes client (``decode_responses=False``), as RQ requires. Raises
    ValueError for an unknown job or a missing/extra/invalid subject. ``run``: see
    :func:`job_id`.
    """
    spec = _lookup(job)
    jid = job_id(job, subject, run=run)
    queue = Queue(spec.queue, connection=conn)
    args = () if subject is None else (subject,)
    for attempt in range(2):
        try:
            queue.enqueue(
                spec.func,
                args=args,
                job_id=jid,
                unique=True,
                result_ttl=0,
                failure_ttl=FAILURE_TTL,
                job_timeout=spec.timeout,
                description=jid,
                ttl=None if run is None else RUN_WAIT_TTL,
            )
            return True
        except DuplicateJobError:
            if attempt or not _reclaim(conn, queue, jid):
                return False
    return False


def enqueue_many(
    conn: redis.Redis, job: str, subjects: Sequence[str], *, chunk: int = ENQUEUE_CHUNK
) -> int:
    """:func:`enqueue` for many subjects of one job; returns how many were newly queued.

    The same guarantees as :func:`enqueue` (deterministic ids, at most one live copy per
    id, ``result_ttl=0``, :data:`FAILURE_TTL`, the job's timeout, a plainly dead
    duplicate reclaimed and queued) in a constant number of round trips per ``chunk``
    subjects: two pipelines (see the module docstring). A subject given twice is queued once.
    Every subject is validated before anything is sent: one invalid subject raises
    ValueError and nothing is queued.
    """
    spec = _lookup(job)
    if spec.subject is None:
        raise ValueError(f"job {job!r} takes no subject; use enqueue()")
    if chunk < 1:
        raise ValueError("chunk must be >= 1")
    # job_id validates; dict.fromkeys keeps the first occurrence, in order.
    items = list(dict.fromkeys((job_id(job, subject), subject) for subject in subjects))
    if not items:
        return 0
    queue = Queue(spec.queue, connection=conn)
    push = conn.register_script(UNIQUE_ENQUEUE_SCRIPT)
    reclaim = conn.register_script(_RECLAIM_LUA)
    queued = 0
    for start in range(0, len(items), chunk):
        part = items[start : start + chunk]
        # Reclaim first: the script answers "free" for an absent or plainly dead job
        # (deleting the dead hash) and "live" otherwise, so the live duplicates (the
        # usual case when workers are behind) cost no job building at all. A copy that
        # appears between the two pipelines is fresh and live: the push refuses it.
        pipe = conn.pipeline(transaction=False)
        for jid, _ in part:
            reclaim(
                keys=[Queue.job_class.key_for(jid), queue.key],
                args=[HEARTBEAT_FIELD, STALE_AFTER_SECONDS, jid],
                client=pipe,
            )
        free = [item for item, ok in zip(part, pipe.execute(), strict=True) if ok]
        if free:
            queued += len(free) - len(_push_unique(conn, queue, spec, push, free))
    return queued


def _push_unique(
    conn: redis.Redis,
    queue: Queue,
    spec: JobSpec,
    push: Script,
    items: Sequence[tuple[str, str]],
) -> list[tuple[str, str]]:
    """Build each job exactly as ``Queue.enqueue(..., unique=True)`` does (create_job,
    origin, _prepare_for_queue, RQ's HSET fields) and run RQ's unique-enqueue script for
    all of them in one non-transactional pipeline. Returns the items refused as
    duplicates."""
    pipe = conn.pipeline(transaction=False)
    pipe.sadd(queue.redis_queues_keys, queue.key)  # what enqueue_job does first
    for jid, subject in items:
        rq_job: Job = queue.create_job(
            spec.func,
            args=(subject,),
            job_id=jid,
            result_ttl=0,
            failure_ttl=FAILURE_TTL,
            timeout=spec.timeout,
            description=jid,
        )
        rq_job.origin = queue.name
        queue._prepare_for_queue(rq_job)
        ttl = rq_job.ttl if rq_job.ttl is not None else -1
        hset: list[Any] = _build_hset_args(rq_job)  # type: ignore[no-untyped-call]
        push(keys=[rq_job.key, queue.key], args=[rq_job.id, "R", ttl, *hset], client=pipe)
    results = pipe.execute()[1:]
    return [item for item, ok in zip(items, results, strict=True) if not ok]


class RQDispatcher:
    """vmpool.lifecycle's Dispatcher: each follow-up step becomes a deduplicated RQ job.

    A refused duplicate is not an error: the copy already queued (or running) will do
    the work, and the periodic sweeps re-find anything a lost job leaves behind.
    """

    def __init__(self, conn: redis.Redis) -> None:
        self.conn = conn

    def provision_request(self, request_id: str) -> None:
        enqueue(self.conn, "provision", request_id)

    def create_vm(self, name: str) -> None:
        enqueue(self.conn, "create-vm", name)

    def check_pending_vm(self, name: str) -> None:
        enqueue(self.conn, "check-pending", name)

    def check_request(self, request_id: str) -> None:
        enqueue(self.conn, "check-request", request_id)

    def destroy_vm(self, name: str) -> None:
        enqueue(self.conn, "destroy", name)

    # Batched forms (the sweeps): a constant number of round trips per ENQUEUE_CHUNK.
    def provision_requests(self, request_ids: Sequence[str]) -> None:
        enqueue_many(self.conn, "provision", request_ids)

    def create_vms(self, names: Sequence[str]) -> None:
        enqueue_many(self.conn, "create-vm", names)

    def check_pending_vms(self, names: Sequence[str]) -> None:
        enqueue_many(self.conn, "check-pending", names)

    def destroy_vms(self, names: Sequence[str]) -> None:
        enqueue_many(self.conn, "destroy", names)
