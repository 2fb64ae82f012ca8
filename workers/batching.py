"""The batching dispatcher: per-subject work goes to a work set and one batch job.

:class:`BatchDispatcher` is the worker fleet's Dispatcher. Three kinds of per-subject
work make up a VM's way to ready: ``provision_request``, ``create_vm`` and
``check_pending_vm``. For them it adds the subjects to the job's work set
(:class:`vmpool.state.workset.WorkSet`, a ``ZADD NX``: the set is the dedup). It then
makes sure a batch job (:mod:`vmpool.lifecycle.batch`) is queued to run them: one of
:data:`LANES` job ids per batch job (``<tag>-create_vm_batch_r<lane>``), each ``unique``
as every vmpool job. :func:`ensure_lanes` costs one script (the work-set add and the
reclaim checks of the lane ids) and, when some are free, one pipeline of RQ's
unique-enqueue script. That is a constant number of round trips whatever the number of
subjects. Up to ``ceil(subjects / CLAIM_SIZE)`` lanes are queued (at most
:data:`LANES`), so a burst of work is shared by that many workers.

Each lane has two job ids, ``_r<lane>`` and ``_r<lane + LANES>``: a batch job that
stopped on time with work left queues the other id of its lane (:func:`continue_batch`,
as its own id is still live while it runs), at the back of the queue. A lane is free when
both its ids are.

A subject added while every lane's job exists and is about to finish waits for the
next dispatch of it. The periodic sweeps re-dispatch every booting VM each
``check_pending_sweep`` tick, every stale reservation after ``reserved_grace_s``, and
every request with unreserved slots each ``provision_sweep`` tick (the same bound as a
per-subject job lost today). The other jobs (destroy_vm, check_request) stay one job
per subject.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import redis
from rq.job import get_current_job

from vmpool.config import Config
from vmpool.ids import Job
from vmpool.lifecycle import Fleet
from vmpool.lifecycle.batch import BATCHED, CLAIM_SIZE
from vmpool.state.keys import Keys
from vmpool.state.lua import ScriptCall, ScriptPipeline, read_script
from vmpool.state.workset import WorkSet, lua_workset
from workers.queues import (
    HEARTBEAT_FIELD,
    RECLAIM_LUA,
    RUN_WAIT_TTL,
    STALE_AFTER_SECONDS,
    RQDispatcher,
    enqueue,
    push_unique,
    valid_items,
)
from workers.table import job_id, lookup

__all__ = [
    "LANES",
    "BatchDispatcher",
    "LaneFollowUp",
    "LaneProbe",
    "continue_batch",
    "continued",
    "ensure_lanes",
    "lanes_for",
    "probe_lanes",
    "queue_free_lanes",
]

# Batch jobs of one kind that may be queued or running at once, when no config says
# (``:config: batch_lanes``, see :func:`lanes_for`).
LANES: Final = 4
# Most lanes of one batch job.
MAX_LANES: Final = 64
# Lanes one dispatch checks (at least, more when it wants more): a window of them from a
# random lane, so the cost of a dispatch does not grow with the number of lanes.
PROBE: Final = 4
_BATCH_OF: Final = {job: batch for batch, job in BATCHED.items()}
# The work-set add and the lanes' reclaim checks of one dispatch, one script: the text of
# reclaim_job.lua becomes its function reclaim(KEYS, ARGV) (see lanes_probe.lua).
_PROBE_LUA: Final = (
    f"local function reclaim(KEYS, ARGV)\n{RECLAIM_LUA}\nend\n"
    + lua_workset()
    + read_script("workers", "lanes_probe.lua")
)


def lanes_for(config: Config | None, batch_job: Job) -> int:
    """How many lanes ``batch_job`` has: ``:config: batch_lanes`` (at most :data:`MAX_LANES`).

    A create batch runs its provider calls one after the other, so
    for creates this is also how many run at once: the clouds here answer a create at
    once (the VM boots afterwards), but a provider whose create blocks (a vSphere clone)
    wants as many lanes as clone slots. More lanes than needed cost RQ jobs that find
    little to do (measured: docs/benchmarks.md).
    """
    del batch_job  # one setting for every kind today. The argument is the place for more
    if config is None:
        return LANES
    return max(1, min(MAX_LANES, config.batch_lanes))


def ensure_lanes(
    conn: redis.Redis,
    keys: Keys,
    batch_job: Job,
    want: int = 1,
    add: tuple[WorkSet, Job, Sequence[str]] | None = None,
    lanes: int = LANES,
    rng: random.Random | None = None,
) -> int:
    """Queue up to ``want`` free lanes of ``batch_job``. Returns how many were queued.

    A lane is free when its two ids both are (absent or plainly dead). One script
    (lanes_probe.lua: the add and the reclaim checks), then, only when some lanes are
    free, one pipeline of RQ's unique-enqueue script. ``add`` (work set, job, subjects):
    added to the work set first, in the same script (the subjects are in the set before
    any lane is checked).

    Only a window of ``max(want, PROBE)`` lanes is checked, from a random one: with many
    lanes (creates follow the clone limit) a dispatch costs the same as with four. When
    every lane of the window is live, none is queued: the live ones drain the work set
    (a batch job claims until it is empty, then its continuation).
    """
    probe = probe_lanes(conn, keys, batch_job, want, add, lanes, rng)
    return queue_free_lanes(conn, keys, probe, probe.call.run())


@dataclass(frozen=True)
class LaneProbe:
    """The lane check of one dispatch (:func:`probe_lanes`).

    The script call to run, and what :func:`queue_free_lanes` needs to read its reply.
    """

    call: ScriptCall
    batch_job: Job
    free_ids: list[str]  # per probed lane, in probe order: the id to queue when free


def probe_lanes(
    conn: redis.Redis,
    keys: Keys,
    batch_job: Job,
    want: int = 1,
    add: tuple[WorkSet, Job, Sequence[str]] | None = None,
    lanes: int = LANES,
    rng: random.Random | None = None,
    run_ids: Sequence[str] | None = None,
) -> LaneProbe:
    """:func:`ensure_lanes`'s script call, to run alone or pipelined.

    Pipelined after the caller's own script: the API's create_request, which adds the
    request to the work set. ``run_ids``: the job ids of ``batch_job`` by run,
    ``2 * lanes`` of them, when the caller keeps them (else made here).
    """
    window = min(lanes, max(want, PROBE))
    start = (rng or random).randrange(lanes) if window < lanes else 0
    probed = [(start + i) % lanes for i in range(window)]
    runs = [run for lane in probed for run in (lane, lane + lanes)]
    ids = [run_ids[run] if run_ids else job_id(keys, batch_job, run=run) for run in runs]
    job = add[1] if add else BATCHED[batch_job]
    work_key = add[0].keys.work_set(job) if add else keys.work_set(job)
    head, tail = add[0].record_key_parts(job) if add else ("", "")
    args: list[Any] = [HEARTBEAT_FIELD, STALE_AFTER_SECONDS, max(0, want), head, tail]
    args += add[2] if add else ()
    keys_ = [work_key, *(keys.rq_job(jid) for jid in ids)]
    call = ScriptCall(conn.register_script(_PROBE_LUA), keys_, args)
    return LaneProbe(call, batch_job, ids[::2])


def queue_free_lanes(conn: redis.Redis, keys: Keys, probe: LaneProbe, found: Any) -> int:
    """Queue the lanes ``probe``'s reply ``found`` says are free. How many were queued.

    One pipeline of RQ's unique-enqueue script, none when no lane is free.
    """
    free = [probe.free_ids[int(i) - 1] for i in found or ()]
    if not free:
        return 0
    jobs = [(jid, ()) for jid in free]
    return sum(push_unique(conn, keys, lookup(probe.batch_job), jobs, ttl=RUN_WAIT_TTL))


@dataclass(frozen=True)
class LaneFollowUp:
    """The lane check pipelined after a create (:meth:`BatchDispatcher.provision_after_create`)."""

    conn: redis.Redis
    keys: Keys
    probe: LaneProbe
    index: int  # the check's place in the pipeline's replies

    def wanted(self, replies: Sequence[Any]) -> bool:
        """Whether :meth:`queue` has work: a lane found free, or the check's error."""
        found = replies[self.index]
        return isinstance(found, Exception) or bool(found)

    def queue(self, replies: Sequence[Any]) -> int:
        """Queue the lanes found free (RQ: blocking). Raises the check's error."""
        found = replies[self.index]
        if isinstance(found, Exception):
            raise found
        return queue_free_lanes(self.conn, self.keys, self.probe, found)


def continue_batch(
    conn: redis.Redis, keys: Keys, batch_job: Job, current_id: str, lanes: int = LANES
) -> bool:
    """Queue the continuation of the batch job ``current_id``: the other id of its lane.

    For a job that stopped on time with work left. False if it could not (a live copy:
    that copy does the work). A run id beyond ``lanes`` (the config had more lanes when
    it was queued) continues on a lane of today's.
    """
    for run in range(2 * MAX_LANES):
        if job_id(keys, batch_job, run=run) == current_id:
            if run < 2 * lanes:
                return enqueue(conn, keys, batch_job, run=(run + lanes) % (2 * lanes))
            break
    # not a lane id (vmpool enqueue ...), or one of more lanes than the config has now
    return ensure_lanes(conn, keys, batch_job, lanes=lanes) > 0


def continued(fleet: Fleet, batch_job: Job, counts: dict[str, int]) -> dict[str, int]:
    """After a batch job ran (in the worker): queue its continuation if one is due.

    Due when it stopped on time with work left (``counts['more']``). Returns ``counts``.
    """
    current = get_current_job()
    if counts.get("more") and current is not None and isinstance(fleet.dispatch, RQDispatcher):
        lanes = lanes_for(fleet.config, batch_job)
        continue_batch(fleet.dispatch.conn, fleet.keys, batch_job, current.id, lanes)
    return counts


class BatchDispatcher(RQDispatcher):
    """RQDispatcher whose VM-bound work is batched (see the module docstring)."""

    def __init__(self, conn: redis.Redis, keys: Keys, config: Config | None = None) -> None:
        super().__init__(conn, keys)
        self.work = WorkSet(conn, keys)
        self.config = config
        # Per (batch job, lanes): its job ids by run, and its probe when that never varies.
        self._run_ids: dict[tuple[str, int], list[str]] = {}
        self._probes: dict[tuple[str, int], LaneProbe] = {}

    def send(self, job: Job, subjects: Sequence[str]) -> None:
        """Batched work to its work set and batch job, the rest as RQDispatcher sends it."""
        if job not in _BATCH_OF:
            super().send(job, subjects)
            return
        # A subject that is no valid name of its kind is skipped, logged and counted,
        # as enqueue_many does (the sweeps feed ids read back from Redis).
        subjects = [s for _, s in valid_items(self.conn, self.keys, lookup(job), subjects)]
        if not subjects:
            return
        batch_job = _BATCH_OF[job]
        lanes = lanes_for(self.config, batch_job)
        want = min(lanes, math.ceil(len(subjects) / CLAIM_SIZE))
        ensure_lanes(
            self.conn, self.keys, batch_job, want, add=(self.work, job, subjects), lanes=lanes
        )

    def provision_after_create(self, pipeline: ScriptPipeline) -> LaneFollowUp:
        """Add to ``pipeline`` what starts the provisioning of the request it creates.

        The create (create_request.lua given the provision work set, KEYS[7]) adds the
        request to the work set in its own unit. This adds the lane check after it (one
        round trip per POST). The follow-up reads the check's reply and queues the
        lanes it found free.
        """
        probe = self._provision_probe()
        return LaneFollowUp(self.conn, self.keys, probe, pipeline.add(probe.call))

    def _provision_probe(self) -> LaneProbe:
        """The lane check of a provision_request send without its work-set add."""
        batch_job = _BATCH_OF[Job.PROVISION_REQUEST]
        lanes = lanes_for(self.config, batch_job)
        probe = self._probes.get((batch_job, lanes))
        if probe is not None:
            return probe
        run_ids = self._run_ids.get((batch_job, lanes))
        if run_ids is None:  # the same ids every POST: made once
            run_ids = [job_id(self.keys, batch_job, run=run) for run in range(2 * lanes)]
            self._run_ids[(batch_job, lanes)] = run_ids
        probe = probe_lanes(self.conn, self.keys, batch_job, lanes=lanes, run_ids=run_ids)
        if lanes <= PROBE:  # the window is every lane, from lane 0: the same call each time
            self._probes[(batch_job, lanes)] = probe
        return probe
