"""The job table: every job vmpool runs, once. Everything else is derived from it.

One row per job, keyed by its name (:class:`vmpool.ids.Job`: the RQ job function in
:mod:`workers.jobs`, the lifecycle function in :mod:`vmpool.lifecycle`, the job id, the
``:schedule:`` key of a periodic job, ``vmpool enqueue``, the ``job`` label of the
``vmpool_worker_jobs`` metric and the docs):

- its **queue**
- its **subject**: what its one argument names (a request id, a VM name, or nothing)
- RQ's hard **timeout** for one run
- whether it is **periodic**: the scheduler enqueues it every ``:schedule:`` interval of
  the same name
- whether it is **bounded**: its interval is a promised bound, see :mod:`workers.schedule`
- whether it is **woken**: it parks while it has nothing to do, and the store's
  reservation of a VM wakes it, see :mod:`workers.schedule_park`.

``aliases`` are the job names older releases used, still accepted by ``vmpool enqueue``.
The config's older ``:schedule:`` keys are the config's own aliases
(``vmpool.config.SCHEDULE_KEY_ALIASES``).

Job ids (RQ allows ``[A-Za-z0-9_-]`` only) carry the fleet's key prefix, so two fleets in
one Redis database never share a job::

    <tag>-<job>                  a periodic job's single id (it never overlaps itself)
    <tag>-<job>_r<due ms>        one scheduled run of a bounded job
    <tag>-<job>-<subject>        a job about one request or VM
    <tag>-schedule-<job>         the scheduler's template of a periodic job

``<tag>`` is the key prefix encoded by :func:`encode_fragment` (``vmpool`` stays
``vmpool``), and so is the subject. The encoding is injective and the tag holds no ``-``, so
the first ``-`` ends the tag. Job names hold no ``-`` either, and ``_r<digits>`` ends
no job name, so no two (prefix, job, subject, run) share an id.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

from vmpool.ids import Job
from vmpool.state.keys import Keys

__all__ = [
    "JOBS",
    "PERIODIC",
    "QUEUES",
    "QUEUE_REQUESTS",
    "QUEUE_SWEEPS",
    "QUEUE_VMS",
    "QUEUE_WEIGHTS",
    "JobSpec",
    "decode_fragment",
    "encode_fragment",
    "job_id",
    "jobs_markdown",
    "lookup",
    "queue_names",
    "spec_of",
    "template_id",
]

# Queues by their short name. The RQ queue name is ``keys.queue(short)``
# (``<prefix>-<short>``: ``vmpool-sweeps`` with the default prefix).
QUEUE_SWEEPS: Final = "sweeps"
QUEUE_REQUESTS: Final = "requests"
QUEUE_VMS: Final = "vms"
# The order a worker listens in (see workers/queues.py for why).
QUEUES: Final[tuple[str, ...]] = (QUEUE_SWEEPS, QUEUE_REQUESTS, QUEUE_VMS)
# The queues a worker serves in weighted turns (workers/turns.py): this many jobs of one
# in a row while the other has jobs waiting. A queue with no weight (the sweeps) is
# served first whenever it has a job.
QUEUE_WEIGHTS: Final[Mapping[str, int]] = MappingProxyType({QUEUE_REQUESTS: 1, QUEUE_VMS: 1})

Subject = Literal["request", "vm", "vm_task"]


@dataclass(frozen=True)
class JobSpec:
    name: Job
    queue: str  # short queue name, one of QUEUES
    subject: Subject | None
    timeout: int  # seconds. RQ's hard limit for one run
    summary: str  # one line, for `vmpool enqueue --help` and the docs
    periodic: bool = False
    bounded: bool = False
    woken: bool = False
    aliases: tuple[str, ...] = ()

    @property
    def func(self) -> str:
        """The dotted path RQ imports in the worker (never imported by the enqueuer)."""
        return f"workers.jobs.{self.name}"


_ROWS: Final = (
    JobSpec(Job.PROVISION_REQUEST, QUEUE_REQUESTS, "request", 120,
            "reserve VMs for a request's unreserved slots", aliases=("provision",)),
    JobSpec(Job.CHECK_REQUEST, QUEUE_REQUESTS, "request", 120,
            "re-check one request: fulfil, expire or provision it", aliases=("check-request",)),
    JobSpec(Job.CREATE_VM, QUEUE_VMS, "vm", 600,
            "create one reserved VM at its provider", aliases=("create-vm",)),
    JobSpec(Job.CHECK_PENDING_VM, QUEUE_VMS, "vm", 120,
            "is one booting VM ready, or past its timeout?", aliases=("check-pending",)),
    JobSpec(Job.DESTROY_VM, QUEUE_VMS, "vm", 600,
            "destroy one completed VM at its provider", aliases=("destroy",)),
    JobSpec(Job.VM_TASK, QUEUE_VMS, "vm_task", 600,
            "take a VM's snapshot, revert it to one, or add a disk (its holder asked)"),
    JobSpec(Job.PROVISION_BATCH, QUEUE_REQUESTS, None, 600,
            "provision_request for every request in its work set"),
    JobSpec(Job.CREATE_VM_BATCH, QUEUE_VMS, None, 600,
            "create_vm for every reserved VM in its work set"),
    JobSpec(Job.CHECK_PENDING_BATCH, QUEUE_VMS, None, 600,
            "check_pending_vm for every booting VM in its work set"),
    JobSpec(Job.SWEEP_EXPIRED, QUEUE_SWEEPS, None, 300,
            "expire pending requests past their TTL (plus grace)",
            periodic=True, bounded=True, aliases=("sweep",)),
    JobSpec(Job.PROVISION_SWEEP, QUEUE_SWEEPS, None, 300,
            "find requests with unreserved slots", periodic=True, aliases=("provision-sweep",)),
    JobSpec(Job.CHECK_PENDING_SWEEP, QUEUE_SWEEPS, None, 300,
            "find booting VMs to check", periodic=True, woken=True,
            aliases=("check-pending-sweep",)),
    JobSpec(Job.REAP_RUNNING, QUEUE_SWEEPS, None, 300,
            "end running VMs past their lifetime", periodic=True, aliases=("reap",)),
    JobSpec(Job.DESTROY_SWEEP, QUEUE_SWEEPS, None, 300,
            "find completed VMs still to destroy", periodic=True, aliases=("destroy-sweep",)),
    JobSpec(Job.RECONCILE, QUEUE_SWEEPS, None, 600,
            "provider inventory against the records", periodic=True),
    JobSpec(Job.TOP_UP_POOLS, QUEUE_SWEEPS, None, 300,
            "clone what each warm pool is short of its size", periodic=True),
    JobSpec(Job.CHECK_READY, QUEUE_SWEEPS, None, 300,
            "re-check ready VMs; recycle those past ready_ttl or failing", periodic=True),
    JobSpec(Job.RECORD_HISTORY, QUEUE_SWEEPS, None, 60,
            "write each pool's counts of this minute (the dashboard's history)", periodic=True),
)  # fmt: skip

# How the jobs table shows a job's argument.
_ARGUMENT_SHOWN: Final = {"request": "request id", "vm": "VM name", "vm_task": "VM task", None: "-"}

JOBS: Final[Mapping[Job, JobSpec]] = MappingProxyType({spec.name: spec for spec in _ROWS})
PERIODIC: Final[tuple[JobSpec, ...]] = tuple(spec for spec in _ROWS if spec.periodic)
# A job by the text that names it: its name or an older alias.
_BY_TEXT: Final[Mapping[str, JobSpec]] = MappingProxyType(
    {text: spec for spec in _ROWS for text in (spec.name.value, *spec.aliases)}
)


def lookup(name: str) -> JobSpec:
    """The job called ``name`` (or an older alias of it): text a person typed.

    ValueError if no job is called so.
    """
    spec = _BY_TEXT.get(name)
    if spec is None:
        raise ValueError(f"unknown job {name!r}; one of: {', '.join(JOBS)}")
    return spec


def spec_of(job: Job) -> JobSpec:
    """The row of ``job``. ValueError for a text that names no job (an untyped caller's)."""
    return JOBS[Job(job)]


def queue_names(keys: Keys) -> list[str]:
    """The fleet's RQ queue names, in the order workers listen to them."""
    return [keys.queue(short) for short in QUEUES]


# -- job ids ----------------------------------------------------------------------------
# '_' opens an escape. '-' (which ends the tag) and the characters RQ refuses get one.
_ESCAPES: Final = {"_": "__", "-": "_d", ".": "_o", ":": "_c"}
_UNESCAPES: Final = {v[1]: k for k, v in _ESCAPES.items()}
_FRAGMENT_RE: Final = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
_ENCODED_RE: Final = re.compile(r"(?:[A-Za-z0-9]|_[_doc])+")


def encode_fragment(text: str, *, keep_dashes: bool = False) -> str:
    """``text`` (a key prefix, request id or VM name) as part of an RQ job id, injectively.

    ``keep_dashes`` leaves ``-`` as it is: for the subject, the last part of an id, so
    that VM names stay readable in the dashboard (``vmpool-create_vm-wild-glen-x1y2z``).
    """
    if not isinstance(text, str) or not _FRAGMENT_RE.fullmatch(text):
        raise ValueError(f"not a key prefix, request id or VM name: {text!r}")
    return "".join("-" if ch == "-" and keep_dashes else _ESCAPES.get(ch, ch) for ch in text)


def decode_fragment(encoded: str) -> str:
    """The inverse of :func:`encode_fragment` (either form)."""
    if not _ENCODED_RE.fullmatch(encoded.replace("-", "_d")):
        raise ValueError(f"not an encoded fragment: {encoded!r}")
    out: list[str] = []
    i = 0
    while i < len(encoded):
        if encoded[i] == "_":
            out.append(_UNESCAPES[encoded[i + 1]])
            i += 2
        else:
            out.append(encoded[i])
            i += 1
    return "".join(out)


def job_id(keys: Keys, job: Job, subject: str | None = None, *, run: int | None = None) -> str:
    """The deterministic RQ job id of ``job`` for ``subject`` in the fleet of ``keys``.

    ``run`` (bounded periodic jobs only) numbers one scheduled run: ``..._r<run>``
    (workers/schedule.py gives each due time its own id).
    """
    spec = spec_of(job)
    head = f"{encode_fragment(keys.prefix)}-{spec.name}"
    if spec.subject is None:
        if subject is not None:
            raise ValueError(f"job {spec.name!r} takes no subject")
        if run is None:
            return head
        if isinstance(run, bool) or not isinstance(run, int) or run < 0:
            raise ValueError(f"a run number is a non-negative integer, got {run!r}")
        return f"{head}_r{run}"
    if run is not None:
        raise ValueError(f"job {spec.name!r} is not periodic: no run number")
    if subject is None:
        raise ValueError(f"job {spec.name!r} needs a {spec.subject} subject")
    return f"{head}-{encode_fragment(subject, keep_dashes=True)}"


def template_id(keys: Keys, job: Job) -> str:
    """The id of the scheduler's template job of periodic ``job``."""
    spec = spec_of(job)
    if not spec.periodic:
        raise ValueError(f"job {spec.name!r} is not periodic")
    return f"{encode_fragment(keys.prefix)}-schedule-{spec.name}"


def jobs_markdown() -> str:
    """The job table as the Markdown table docs/architecture.md carries.

    A test keeps the two equal, so the docs' list is derived from this table, never
    retyped.
    """
    rows = [
        "| job | queue | argument | periodic (`:schedule:` key) | old names | what it does |",
        "|---|---|---|---|---|---|",
    ]
    for spec in JOBS.values():
        periodic = f"yes (`{spec.name}`)" if spec.periodic else "no"
        if spec.bounded:
            periodic += ", bounded"
        if spec.woken:
            periodic += ", woken"
        aliases = ", ".join(f"`{a}`" for a in spec.aliases) or "-"
        argument = _ARGUMENT_SHOWN[spec.subject]
        rows.append(
            f"| `{spec.name}` | {spec.queue} | {argument} | {periodic} | {aliases}"
            f" | {spec.summary} |"
        )
    return "\n".join(rows) + "\n"
