"""The batching dispatcher: per-subject work goes to a work set and one batch job.

:class:`BatchDispatcher` is the worker fleet's Dispatcher. Three kinds of per-subject
work make up a VM's way to ready: ``provision_request``, ``create_vm`` and
``check_pending_vm``. For them it adds the subjects to the job's work set
(:class:`vmpool.state.workset.WorkSet`, a ``ZADD NX``: the set is the dedup). It then
makes sure a batch job (:mod:`vmpool.lifecycle.batch`) is queued to run them: one of
the batch job's :class:`Lanes` (``<tag>-create_vm_batch_r<lane>``), each ``unique``
as every vmpool job. A send costs one script (the work-set add and the reclaim checks
of the lane ids, :meth:`BatchDispatcher.probe`) and, when some lanes are free, one
pipeline of RQ's unique-enqueue script. That is a constant number of round trips
whatever the number of subjects. Up to ``ceil(subjects / CLAIM_SIZE)`` lanes are queued
(at most the lanes there are), so a burst of work is shared by that many workers.

Each lane has two job ids, ``_r<lane>`` and ``_r<lane + lanes>``: a batch job that
stopped on time with work left queues the other id of its lane
(:meth:`BatchDispatcher.continue_batch`, as its own id is still live while it runs), at
the back of the queue. A lane is free when both its ids are.

The way of a batch job, in this module's order: a send (lifecycle) -> its work set and
a free lane (here) -> RQ (:mod:`workers.queues`) -> a worker runs the batch job's entry
point (:mod:`workers.jobs`), which runs the lifecycle's batch function, then
:func:`continued` -> its continuation, back to RQ.

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
from redis.commands.core import Script
from rq.job import get_current_job
from rq.scripts import UNIQUE_ENQUEUE_SCRIPT

from vmpool.config import Config
from vmpool.ids import Job
from vmpool.lifecycle import Fleet
from vmpool.lifecycle.batch import BATCHED, CLAIM_SIZE
from vmpool.lifecycle.pace import StagePace, quick_unseen
from vmpool.state.connection import connect
from vmpool.state.keys import Keys
from vmpool.state.lua import ScriptCall, ScriptPipeline, read_script
from vmpool.state.pace_board import PaceBoard
from vmpool.state.workset import WorkSet, lua_workset
from workers.queues import (
    HEARTBEAT_FIELD,
    RECLAIM_LUA,
    RUN_WAIT_TTL,
    STALE_AFTER_SECONDS,
    RQDispatcher,
    enqueue_ids,
    push_unique,
    valid_subjects,
)
from workers.table import JOBS, QUEUE_SWEEPS, JobSpec, job_id

__all__ = [
    "LANES",
    "BatchDispatcher",
    "LaneFollowUp",
    "LaneProbe",
    "Lanes",
    "build_fleet",
    "continued",
    "lanes_for",
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
# The work-set add and the lanes' reclaim checks of one dispatch, one script: the text of
# reclaim_job.lua becomes its function reclaim(KEYS, ARGV) (see lanes_probe.lua).
_PROBE_LUA: Final = (
    f"local function reclaim(KEYS, ARGV)\n{RECLAIM_LUA}\nend\n"
    + lua_workset()
    + read_script("workers", "lanes_probe.lua")
)


def lanes_for(config: Config | None) -> int:
    """How many lanes a batch job has: ``:config: batch_lanes`` (at most :data:`MAX_LANES`).

    A create batch runs its provider calls one after the other, so
    for creates this is also how many run at once: the clouds here answer a create at
    once (the VM boots afterwards), but a provider whose create blocks (a vSphere clone)
    wants as many lanes as clone slots. More lanes than needed cost RQ jobs that find
    little to do (measured: docs/benchmarks.md).
    """
    if config is None:
        return LANES
    return max(1, min(MAX_LANES, config.batch_lanes))


@dataclass(frozen=True)
class Lanes:
    """The lanes of one batch job: its row, its work set, its job id of each run.

    Lane ``n`` is runs ``n`` and ``n + count``.
    """

    batch: JobSpec  # the batch job's row of the job table
    work: JobSpec  # the per-subject job whose work set it runs
    work_set: str  # that work set's key
    record_key_parts: tuple[str, str]  # its subjects' (WorkSet.record_key_parts)
    ids: tuple[str, ...]  # by run, two per lane

    @classmethod
    def of(cls, work: WorkSet, batch_job: Job, count: int) -> Lanes:
        """``count`` lanes of ``batch_job`` whose work set is in ``work``."""
        job = BATCHED[batch_job]
        ids = tuple(job_id(work.keys, batch_job, run=run) for run in range(2 * count))
        parts = work.record_key_parts(job)
        return cls(JOBS[batch_job], JOBS[job], work.keys.work_set(job), parts, ids)

    @property
    def count(self) -> int:
        return len(self.ids) // 2

    def continuation(self, current_id: str) -> str | None:
        """The other id of the lane of ``current_id``. None if it is no id of these lanes."""
        if current_id not in self.ids:
            return None
        return self.ids[(self.ids.index(current_id) + self.count) % len(self.ids)]


@dataclass(frozen=True)
class LaneProbe:
    """The lane check of one dispatch (:meth:`BatchDispatcher.probe`).

    The script call to run, and what :func:`queue_free_lanes` needs to read its reply.
    """

    call: ScriptCall
    batch: JobSpec
    first_ids: list[str]  # per probed lane, in probe order: the id to queue when free

    def free(self, found: Any) -> list[str]:
        """The ids to queue of the lanes the reply ``found`` says are free."""
        return [self.first_ids[int(i) - 1] for i in found or ()]


def queue_free_lanes(conn: redis.Redis, keys: Keys, probe: LaneProbe, found: Any) -> int:
    """Queue the lanes ``probe``'s reply ``found`` says are free. How many were queued.

    One pipeline of RQ's unique-enqueue script, none when no lane is free (the probe
    made the reclaim checks).
    """
    jobs = [(jid, ()) for jid in probe.free(found)]
    return sum(push_unique(conn, keys, probe.batch, jobs, ttl=RUN_WAIT_TTL)) if jobs else 0


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


class BatchDispatcher(RQDispatcher):
    """RQDispatcher whose VM-bound work is batched (see the module docstring)."""

    def __init__(
        self,
        conn: redis.Redis,
        keys: Keys,
        config: Config | None = None,
        rng: random.Random | None = None,
        serves_sweeps: bool = True,
    ) -> None:
        super().__init__(conn, keys, serves_sweeps)
        self.work = WorkSet(conn, keys)
        count = lanes_for(config)
        # The lanes of each batch job, by the per-subject job it runs.
        self.lanes = {job: Lanes.of(self.work, batch, count) for batch, job in BATCHED.items()}
        self._rng = rng or random.Random()
        self._probes: dict[Job, LaneProbe] = {}  # the probes that never vary

    @property
    def scripts(self) -> list[Script]:
        """The scripts its sends run: the lane check, RQ's unique enqueue, the reclaim
        (for :func:`~vmpool.state.lua.load_missing`)."""
        texts = (_PROBE_LUA, UNIQUE_ENQUEUE_SCRIPT, RECLAIM_LUA)
        return [self.conn.register_script(text) for text in texts]

    def send(self, job: Job, subjects: Sequence[str]) -> None:
        """Batched work to its work set and a lane, the rest as RQDispatcher sends it."""
        lanes = self.lanes.get(job)
        if lanes is None:
            super().send(job, subjects)
            return
        # A subject that is no valid name of its kind is skipped, logged and counted,
        # as enqueue_many does (the sweeps feed ids read back from Redis).
        subjects = valid_subjects(self.conn, self.keys, lanes.work, subjects)
        if subjects:
            self.queue_lanes(lanes, math.ceil(len(subjects) / CLAIM_SIZE), subjects)

    def queue_lanes(self, lanes: Lanes, want: int = 1, subjects: Sequence[str] = ()) -> int:
        """Add ``subjects`` to the work set, then queue up to ``want`` free lanes.

        How many were queued: one script (:meth:`probe`), then, only when some lanes are
        free, one pipeline of RQ's unique-enqueue script.
        """
        probe = self.probe(lanes, want, subjects)
        return queue_free_lanes(self.conn, self.keys, probe, probe.call.run())

    def probe(self, lanes: Lanes, want: int = 1, subjects: Sequence[str] = ()) -> LaneProbe:
        """The script that adds ``subjects`` to the work set and finds ``want`` free lanes.

        The subjects are in the set before any lane is checked (lanes_probe.lua). At most
        as many lanes as there are are wanted.

        Only a window of ``max(want, PROBE)`` lanes is checked, from a random one: with
        many lanes (creates follow the clone limit) a dispatch costs the same as with
        four. When every lane of the window is live, none is free: the live ones drain
        the work set (a batch job claims until it is empty, then its continuation).
        """
        want = max(0, min(lanes.count, want))
        window = min(lanes.count, max(want, PROBE))
        start = self._rng.randrange(lanes.count) if window < lanes.count else 0
        probed = [(start + i) % lanes.count for i in range(window)]
        ids = [lanes.ids[run] for lane in probed for run in (lane, lane + lanes.count)]
        head, tail = lanes.record_key_parts
        args = [HEARTBEAT_FIELD, STALE_AFTER_SECONDS, want, head, tail, *subjects]
        keys = [lanes.work_set, *(Keys.rq_job(jid) for jid in ids)]
        call = ScriptCall(self.conn.register_script(_PROBE_LUA), keys, args)
        return LaneProbe(call, lanes.batch, ids[::2])

    def provision_after_create(self, pipeline: ScriptPipeline) -> LaneFollowUp:
        """Add to ``pipeline`` what starts the provisioning of the request it creates.

        The create (create_request.lua given the provision work set, KEYS[7]) adds the
        request to the work set in its own unit. This adds the lane check after it (one
        round trip per POST). The follow-up reads the check's reply and queues the
        lanes it found free.
        """
        probe = self._probes.get(Job.PROVISION_REQUEST)
        if probe is None:
            lanes = self.lanes[Job.PROVISION_REQUEST]
            probe = self.probe(lanes)
            if lanes.count <= PROBE:  # the window is every lane, from lane 0: the same call
                self._probes[Job.PROVISION_REQUEST] = probe
        return LaneFollowUp(self.conn, self.keys, probe, pipeline.add(probe.call))

    def continue_batch(self, batch_job: Job, current_id: str) -> bool:
        """Queue the continuation of the batch job ``current_id``: the other id of its lane.

        For a job that stopped on time with work left. False if it could not (a live
        copy: that copy does the work). An id that is no lane's (``vmpool enqueue``, or a
        run of more lanes than the config has now) continues on a free lane of today's.
        """
        lanes = self.lanes[BATCHED[batch_job]]
        after = lanes.continuation(current_id)
        if after is None:
            probe = self.probe(lanes)
            ids = probe.free(probe.call.run())
        else:
            ids = [after]
        jobs = [(jid, ()) for jid in ids]
        return enqueue_ids(self.conn, self.keys, lanes.batch, jobs, ttl=RUN_WAIT_TTL) > 0


def continued(fleet: Fleet, batch_job: Job, counts: dict[str, int]) -> dict[str, int]:
    """After a batch job ran (in the worker): queue its continuation if one is due.

    Due when it stopped on time with work left (``counts['more']``). Returns ``counts``.
    """
    current = get_current_job()
    if counts.get("more") and current is not None and isinstance(fleet.dispatch, BatchDispatcher):
        fleet.dispatch.continue_batch(batch_job, current.id)
    return counts


def build_fleet(
    redis_url: str, config: Config, conn: redis.Redis, actor: str, queues: Sequence[str]
) -> Fleet:
    """A worker process's Fleet: a decoding client for the domain, batched dispatch on
    ``conn``. Its batch jobs stop for a waiting sweep when ``queues`` (RQ queue names,
    the worker's) include the sweeps'."""
    client = connect(redis_url, config.redis_options, decode_responses=True)
    keys = Keys(config.key_prefix)
    sweeps = keys.queue(QUEUE_SWEEPS) in queues
    dispatch = BatchDispatcher(conn, keys, config, serves_sweeps=sweeps)
    fleet = Fleet.build(client, config, dispatch, actor)
    # The fleet's word on unseen stages; its own providers' on creates.
    fleet.pace = StagePace(
        board=PaceBoard(client, keys), unseen=quick_unseen(fleet.providers.values())
    )
    return fleet
