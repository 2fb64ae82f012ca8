"""The vmpool worker: an RQ worker that carries its process's Fleet to the jobs it runs.

How a job reaches its Fleet (no module globals, no hidden singleton):
the bootstrap (:func:`build_worker`) builds one :class:`vmpool.lifecycle.Fleet` per
worker process and stores it on the worker object. The worker is built with
``job_class=FleetJob``; right before a job runs, the worker binds its Fleet to that job
object (``job.fleet``). The job function finds it through RQ's own current-job context
(``rq.get_current_job()``, a contextvar RQ sets around ``job.perform()``):
:func:`current_fleet`. A vmpool job run by a plain ``rq worker`` fails at once with a
clear error instead of guessing a configuration.

Worker class (see docs/benchmarks.md for the figures, docs/architecture.md for the
argument): :class:`FleetSimpleWorker` (no fork per job) is the default; the forking
:class:`FleetForkWorker` stays available (``vmpool worker --fork``) for isolation.

Redis outages, fatal errors and the alive file of Kubernetes' liveness probe: both
classes are :class:`workers.loop.SteadyLoop`, see there. While a job runs, its
heartbeat thread touches the alive file, for as long as the job's timeout plus
:data:`HUNG_AFTER_S` (past that the job, and so the loop, is wedged).

Abandoned jobs: RQ notices a dead worker's job when its StartedJobRegistry entry
expires (``min(job_monitoring_interval, timeout) + 60`` s) and a maintenance pass runs.
:data:`RQ_SETTINGS` keep that near a minute, for both classes: the SimpleWorker
variant refreshes RQ's heartbeats from a thread while a job runs (stock SimpleWorker
sets a TTL of job timeout + 60 s once and never refreshes it). The same thread writes
the vmpool heartbeat (Redis server time) that :func:`workers.queues.enqueue` uses to
reclaim a dead job's id within seconds. vmpool never relies on RQ re-running a job:
no ``Retry``; the periodic sweeps find the work.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import redis
from rq import Queue, SimpleWorker, Worker
from rq.executions import Execution
from rq.job import Job, get_current_job
from rq.worker.base import BaseWorker

from vmpool.lifecycle import Fleet
from vmpool.state.counters import record_job
from vmpool.state.keys import DEFAULT_PREFIX, Keys
from vmpool.state.lua import read_script
from workers.batching import BatchDispatcher
from workers.dequeue import StampingQueue
from workers.loop import REDIS_GONE, AliveFile, RedisOutage, SteadyLoop
from workers.queues import HEARTBEAT_FIELD, HEARTBEAT_SECONDS, queue_names

if TYPE_CHECKING:
    from vmpool.config import Config

__all__ = [
    "RQ_SETTINGS",
    "WORKER_CLASSES",
    "FleetForkWorker",
    "FleetJob",
    "FleetSimpleWorker",
    "build_fleet",
    "build_worker",
    "current_fleet",
    "worker_name",
]

log = logging.getLogger(__name__)

# RQ's abandoned-job settings (docs/architecture.md, "Worker death"): a killed worker's
# job is noticed in about a minute (entry TTL 5 + 60 s, a maintenance pass every 10 s;
# an idle worker wakes every worker_ttl - 15 = 15 s to run it).
RQ_SETTINGS: Final[dict[str, int]] = {
    "job_monitoring_interval": 5,
    "maintenance_interval": 10,
    "worker_ttl": 30,
}

# A job running this long past its timeout no longer vouches for the loop: RQ's fork
# monitor kills a horse at the same point.
HUNG_AFTER_S: Final = 60.0

# HSET the vmpool heartbeat (server time) on a job hash that still exists.
_BEAT_LUA: Final = read_script("workers", "job_heartbeat.lua")


class FleetJob(Job):
    """An RQ job that the worker hands its process's Fleet right before running it."""

    fleet: Fleet | None = None


def current_fleet() -> Fleet:
    """The Fleet of the worker running the current job (see the module docstring)."""
    job = get_current_job()
    fleet = job.fleet if isinstance(job, FleetJob) else None
    if fleet is None:
        raise RuntimeError(
            "vmpool jobs run only in a vmpool worker (`vmpool worker`), which gives them"
            " their Fleet; this job has none"
        )
    return fleet


class _Heartbeat:
    """While a job runs: the vmpool heartbeat every HEARTBEAT_SECONDS and, when given,
    RQ's own heartbeats every ``rq_every`` seconds, from a daemon thread; the alive
    file too, within the job's time budget."""

    def __init__(
        self,
        worker: SteadyLoop,
        job: Job,
        rq_beat: Callable[[], None] | None,
        rq_every: float,
        *,
        alive: AliveFile | None,
    ) -> None:
        self._script = worker.connection.register_script(_BEAT_LUA)
        self._key = job.key
        self._rq_beat = rq_beat
        self._rq_every = rq_every
        self._outage: RedisOutage = worker.outage
        self._alive = alive
        budget = job.timeout or Queue.DEFAULT_TIMEOUT  # what RQ's death penalty uses
        self._alive_until = None if budget < 0 else time.monotonic() + budget + HUNG_AFTER_S
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{job.id}", daemon=True)

    def _beat(self) -> None:
        self._script(keys=[self._key], args=[HEARTBEAT_FIELD])

    def _touch_alive(self) -> None:
        if self._alive is not None and (
            self._alive_until is None or time.monotonic() < self._alive_until
        ):
            self._alive.touch()

    def _run(self) -> None:
        since_rq = 0.0
        while not self._stop.wait(HEARTBEAT_SECONDS):
            self._touch_alive()
            try:
                self._beat()
                self._outage.back()
                since_rq += HEARTBEAT_SECONDS
                if self._rq_beat is not None and since_rq >= self._rq_every:
                    since_rq = 0.0
                    self._rq_beat()
            except REDIS_GONE as exc:  # an outage: said once, the next beat may land
                self._outage.lost(exc)
            except Exception:  # a missed beat is not fatal; the next one may work
                log.warning("job heartbeat failed", exc_info=True)

    def __enter__(self) -> _Heartbeat:
        try:
            self._beat()
        except REDIS_GONE as exc:
            self._outage.lost(exc)
        except redis.RedisError:
            log.warning("first job heartbeat failed", exc_info=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class FleetSimpleWorker(SteadyLoop, SimpleWorker):
    """Runs jobs in its own process (no fork), with its Fleet and live heartbeats."""

    fleet: Fleet | None = None
    queue_class = StampingQueue  # pops and stamps the heartbeat in one unit

    def validate_queues(self) -> None:
        _any_rq_queues(self.queues)

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        # Like the forking Worker (short TTL, refreshed by _Heartbeat), not
        # SimpleWorker's "job timeout + 60 s, set once".
        return BaseWorker.get_heartbeat_ttl(self, job, working_time)

    def perform_job(self, job: Job, queue: Queue, execution: Execution) -> bool:
        if isinstance(job, FleetJob):
            job.fleet = self.fleet

        def rq_beat() -> None:
            self.maintain_heartbeats(job, execution)

        beats = _Heartbeat(self, job, rq_beat, float(self.job_monitoring_interval),
                           alive=self.alive)
        with beats:
            ok = bool(super().perform_job(job, queue, execution))
        _count_job(self.fleet, job, ok)
        return ok


class FleetForkWorker(SteadyLoop, Worker):
    """Forks a work horse per job (RQ's default). The parent keeps RQ's heartbeats (and
    the alive file: its monitor kills a hung horse); the horse writes the vmpool
    heartbeat, so it stops exactly when the job's process dies."""

    fleet: Fleet | None = None
    queue_class = StampingQueue  # pops and stamps the heartbeat in one unit

    def validate_queues(self) -> None:
        _any_rq_queues(self.queues)

    def perform_job(self, job: Job, queue: Queue, execution: Execution) -> bool:
        if isinstance(job, FleetJob):
            job.fleet = self.fleet
        with _Heartbeat(self, job, None, 0.0, alive=None):
            ok = bool(super().perform_job(job, queue, execution))
        _count_job(self.fleet, job, ok)  # in the horse: the counter lives in Redis
        return ok


def _any_rq_queues(queues: Sequence[Queue]) -> None:
    """RQ wants every queue to be of ``queue_class``; its dequeue is a class method, so
    a plain ``Queue`` listens just as well (callers and tests build plain ones)."""
    for queue in queues:
        if not isinstance(queue, Queue):
            raise TypeError(f"{queue!r} is not an RQ Queue")


def _count_job(fleet: Fleet | None, job: Job, ok: bool) -> None:
    """One finished job for /metrics (``vmpool_worker_jobs``), counted in Redis so every
    worker process, forked horses included, adds to the same counters."""
    if fleet is None:
        return
    name = (job.func_name or "unknown").rsplit(".", 1)[-1]
    try:
        record_job(fleet.redis, fleet.keys, name, "ok" if ok else "failed")
    except redis.RedisError as exc:  # a metric is never worth failing a job over
        log.debug("job metric not recorded: %s", exc)


WORKER_CLASSES: Final[dict[str, type[SteadyLoop]]] = {
    "simple": FleetSimpleWorker,
    "fork": FleetForkWorker,
}


def worker_name() -> str:
    """Unique per process and per start (a restarted pod may reuse host name and pid)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def build_fleet(redis_url: str, config: Config, conn: redis.Redis, actor: str) -> Fleet:
    """The per-process Fleet: a decoding client for the domain, RQ dispatch on ``conn``."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    dispatch = BatchDispatcher(conn, Keys(config.key_prefix), config)
    return Fleet.build(client, config, dispatch, actor)


def build_worker(
    redis_url: str,
    config: Config | None,
    queues: Sequence[str] | None = None,
    *,
    kind: str = "simple",
    name: str | None = None,
    alive: AliveFile | None = None,
    **overrides: Any,
) -> SteadyLoop:
    """A worker of ``kind`` ("simple" | "fork") on ``queues`` holding its Fleet.

    ``queues``: RQ queue names (default: all of the fleet's, in priority order).
    ``config`` None builds a worker without a Fleet (benchmarks of no-op jobs only).
    ``alive``: the file to touch while the loop lives (workers/loop.py).
    """
    cls = WORKER_CLASSES[kind]
    if queues is None:
        queues = queue_names(Keys(config.key_prefix if config else DEFAULT_PREFIX))
    conn = redis.Redis.from_url(redis_url)  # bytes, as RQ requires
    name = name or worker_name()
    settings: dict[str, Any] = {**RQ_SETTINGS, **overrides}
    worker = cls(
        [Queue(q, connection=conn) for q in queues],
        connection=conn,
        name=name,
        job_class=FleetJob,
        **settings,
    )
    worker.alive = alive
    if config is not None:
        fleet = build_fleet(redis_url, config, conn, actor=f"worker:{name}")
        if isinstance(worker, FleetSimpleWorker | FleetForkWorker):
            worker.fleet = fleet
    return worker
