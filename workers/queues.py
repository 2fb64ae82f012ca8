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

A worker listens to all three in that order (RQ dequeues by strict priority): request
jobs first, so a new request starts at once however long the VM backlog; then the
sweeps, of which at most six are ever queued (one per kind), so they cannot starve the
VM jobs but are never stuck behind them either; then the VM jobs, the bulk of the work.

Job ids are deterministic: ``<job>`` for a sweep, ``<job>-<subject>`` otherwise. RQ ids
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
job, or a ``started`` job whose vmpool heartbeat (written every
:data:`HEARTBEAT_SECONDS` by the process running it, in Redis server time) is older than
:data:`STALE_AFTER_SECONDS`. The hash is deleted and the enqueue retried once. A paused
process that resumes after its job was reclaimed may run beside the new copy or delete
its hash when it finishes (``result_ttl=0``); both are harmless because every job is
idempotent and the periodic sweeps re-find any work a lost job leaves behind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

import redis
from rq import Queue
from rq.exceptions import DuplicateJobError

__all__ = [
    "FAILURE_TTL",
    "HEARTBEAT_FIELD",
    "HEARTBEAT_SECONDS",
    "JOBS",
    "QUEUES",
    "QUEUE_REQUESTS",
    "QUEUE_SWEEPS",
    "QUEUE_VMS",
    "STALE_AFTER_SECONDS",
    "JobSpec",
    "RQDispatcher",
    "decode_subject",
    "encode_subject",
    "enqueue",
    "job_id",
    "resolve_queue_names",
]

QUEUE_REQUESTS: Final = "vmpool-requests"
QUEUE_SWEEPS: Final = "vmpool-sweeps"
QUEUE_VMS: Final = "vmpool-vms"
# The order a worker listens in (strict priority, see the module docstring).
QUEUES: Final[tuple[str, ...]] = (QUEUE_REQUESTS, QUEUE_SWEEPS, QUEUE_VMS)

# A failed job's hash (and so its block on re-enqueue) lives this long; the traceback is
# in the worker's log. Reclaiming in enqueue() makes even this a soft limit.
FAILURE_TTL: Final = 10
# The process running a job refreshes HEARTBEAT_FIELD on the job hash this often ...
HEARTBEAT_SECONDS: Final = 2.0
HEARTBEAT_FIELD: Final = "vmpool_heartbeat"
# ... and a started job whose heartbeat is older than this is taken for dead.
STALE_AFTER_SECONDS: Final = 10.0


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


def job_id(job: str, subject: str | None = None) -> str:
    """The deterministic RQ job id of ``job`` for ``subject``."""
    spec = _lookup(job)
    if spec.subject is None:
        if subject is not None:
            raise ValueError(f"job {job!r} takes no subject")
        return spec.name
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


# Deletes the hash of a duplicate job that is plainly dead (see the module docstring).
# KEYS[1] job hash; ARGV[1] heartbeat field, ARGV[2] stale-after seconds.
# Returns 1 when the id is free now (deleted, or already gone), 0 when it is live.
_RECLAIM_LUA: Final = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 1 end
if status == 'failed' or status == 'stopped' or status == 'canceled' then
  redis.call('DEL', KEYS[1]); return 1
end
if status == 'started' then
  local hb = tonumber(redis.call('HGET', KEYS[1], ARGV[1]))
  if hb == nil then return 0 end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  if now - hb > tonumber(ARGV[2]) then redis.call('DEL', KEYS[1]); return 1 end
end
return 0
"""


def _reclaim(conn: redis.Redis, jid: str) -> bool:
    script = conn.register_script(_RECLAIM_LUA)
    key = Queue.job_class.key_for(jid)
    return bool(script(keys=[key], args=[HEARTBEAT_FIELD, STALE_AFTER_SECONDS]))


def enqueue(conn: redis.Redis, job: str, subject: str | None = None) -> bool:
    """Put ``job`` for ``subject`` on its queue; False when a live copy already exists.

    ``conn`` is a bytes client (``decode_responses=False``), as RQ requires. Raises
    ValueError for an unknown job or a missing/extra/invalid subject.
    """
    spec = _lookup(job)
    jid = job_id(job, subject)
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
            )
            return True
        except DuplicateJobError:
            if attempt or not _reclaim(conn, jid):
                return False
    return False


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
