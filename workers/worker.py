"""The vmpool worker: an RQ worker that carries its process's Fleet to the jobs it runs.

How a job reaches its Fleet (no module globals, no hidden singleton):
the bootstrap (:func:`build_worker`) builds one :class:`vmpool.lifecycle.Fleet` per
worker process and stores it on the worker object. The worker is built with
``job_class=FleetJob``. Right before a job runs, the worker binds its Fleet to that job
object (``job.fleet``). The job function finds it through RQ's own current-job context
(``rq.get_current_job()``, a contextvar RQ sets around ``job.perform()``):
:func:`current_fleet`. A vmpool job run by a plain ``rq worker`` fails at once with a
clear error instead of guessing a configuration.

Worker class (see docs/benchmarks.md for the figures, docs/architecture.md for the
argument): :class:`FleetSimpleWorker` (no fork per job) is the default. The forking
:class:`FleetForkWorker` stays available (``vmpool worker --fork``) for isolation.

Redis outages, fatal errors and the alive file of Kubernetes' liveness probe: both
classes are :class:`workers.loop.SteadyLoop`, see there. While a job runs, the
worker's heartbeat thread (:class:`JobBeats`: one per worker process, not one per job)
touches the alive file, for as long as the job's timeout plus :data:`HUNG_AFTER_S`
(past that the job, and so the loop, is wedged).

Abandoned jobs: RQ notices a dead worker's job when its StartedJobRegistry entry
expires (``min(job_monitoring_interval, timeout) + 60`` s) and a maintenance pass runs.
:data:`RQ_SETTINGS` keep that near a minute, for both classes: the SimpleWorker
variant refreshes RQ's heartbeats from that thread while a job runs (stock SimpleWorker
sets a TTL of job timeout + 60 s once and never refreshes it). The same thread writes
the vmpool heartbeat (Redis server time) that :func:`workers.queues.enqueue` uses to
reclaim a dead job's id within seconds. vmpool never relies on RQ re-running a job:
no ``Retry``. The periodic sweeps find the work.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import redis
from rq import Queue, SimpleWorker, Worker
from rq.executions import Execution
from rq.job import Job, get_current_job
from rq.worker.base import BaseWorker

from vmpool.config import default_redis_options
from vmpool.lifecycle import Fleet
from vmpool.state.connection import connect
from vmpool.state.counters import record_job
from vmpool.state.durability import confirmed, unconfirmed
from vmpool.state.keys import DEFAULT_PREFIX, Keys
from vmpool.state.lua import read_script
from workers.batching import BatchDispatcher, build_fleet
from workers.bookkeeping import LeanBeats, LeanJob, LeanSuccess
from workers.dequeue import pop_script
from workers.loop import AliveFile, RedisOutage, SteadyLoop, redis_unusable, writable_check
from workers.queues import HEARTBEAT_FIELD, HEARTBEAT_SECONDS, queue_names
from workers.turns import FairDequeue

if TYPE_CHECKING:
    from vmpool.config import Config

__all__ = [
    "RQ_SETTINGS",
    "WORKER_CLASSES",
    "FleetForkWorker",
    "FleetJob",
    "FleetSimpleWorker",
    "build_worker",
    "current_fleet",
    "worker_name",
]

log = logging.getLogger(__name__)

# RQ's abandoned-job settings (docs/architecture.md, "Worker death"): a killed worker's
# job is noticed in about a minute (entry TTL 5 + 60 s, a maintenance pass every 10 s,
# an idle worker waking every worker_ttl - 15 = 15 s to run it).
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


class FleetJob(LeanJob):
    """An RQ job that the worker hands its process's Fleet right before running it.

    A job with a Fleet is one unit of work (:func:`vmpool.state.durability.confirmed`):
    its writes are confirmed once, when its function returns, before RQ records it done.
    """

    fleet: Fleet | None = None

    def perform(self) -> Any:
        if self.fleet is None:
            return super().perform()
        with confirmed(self.fleet.redis):
            return super().perform()


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


@dataclass
class _Running:
    """The job a :class:`JobBeats` beats now, and when its RQ beat and alive file are due."""

    key: str
    rq_beat: Callable[[], None] | None
    rq_every: float
    alive_until: float | None  # monotonic. None: no time budget
    since_rq: float = 0.0


class JobBeats:
    """The heartbeats of the job a worker runs, from one long-lived daemon thread.

    One thread per worker, not one started and joined per job: every
    HEARTBEAT_SECONDS the vmpool heartbeat of the running job (the reclaim check's
    sign of life), RQ's own heartbeats every ``rq_every`` seconds when given, and the
    alive file within the job's time budget. Between jobs the thread beats nothing.

    Leaving :meth:`running` waits for a beat in flight, so no beat of a job lands
    after its block returned.
    """

    def __init__(self, worker: SteadyLoop, *, alive: AliveFile | None) -> None:
        self._script = worker.connection.register_script(_BEAT_LUA)
        self._outage: RedisOutage = worker.outage
        self._alive = alive
        self._lock = threading.Lock()
        self._beating = threading.Lock()  # held while a beat is in flight
        self._running: _Running | None = None
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def running(
        self, job: Job, rq_beat: Callable[[], None] | None = None, rq_every: float = 0.0
    ) -> Iterator[None]:
        """Beat ``job`` while the block runs: once at once, then from the thread."""
        budget = job.timeout or Queue.DEFAULT_TIMEOUT  # what RQ's death penalty uses
        until = None if budget < 0 else time.monotonic() + budget + HUNG_AFTER_S
        with self._lock:
            self._running = _Running(job.key, rq_beat, rq_every, until)
        self._first_beat(job.key)
        if self._thread is None or not self._thread.is_alive():
            self._closed.clear()
            self._thread = threading.Thread(target=self._run, name="job-beats", daemon=True)
            self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._running = None
            with self._beating:  # a beat that read this job lands before the block ends
                pass

    def close(self) -> None:
        """Stop the thread (the worker's teardown)."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _first_beat(self, key: str) -> None:
        try:
            self._script(keys=[key], args=[HEARTBEAT_FIELD])
        except redis.RedisError as exc:
            if redis_unusable(exc) is None:
                log.warning("first job heartbeat failed", exc_info=True)
            else:
                self._outage.lost(exc)

    def _run(self) -> None:
        with unconfirmed():  # a beat lost by a failover: the job may run twice, as it may
            self._beat_until_closed()

    def _beat_until_closed(self) -> None:
        while not self._closed.wait(HEARTBEAT_SECONDS):
            with self._beating:
                with self._lock:
                    now = self._running
                if now is not None:
                    self._beat(now)

    def _beat(self, now: _Running) -> None:
        if self._alive is not None and (
            now.alive_until is None or time.monotonic() < now.alive_until
        ):
            self._alive.touch()
        try:
            self._script(keys=[now.key], args=[HEARTBEAT_FIELD])
            self._outage.back()
            now.since_rq += HEARTBEAT_SECONDS
            if now.rq_beat is not None and now.since_rq >= now.rq_every:
                now.since_rq = 0.0
                now.rq_beat()
        except Exception as exc:  # a missed beat is not fatal. The next one may work
            if redis_unusable(exc) is None:
                log.warning("job heartbeat failed", exc_info=True)
            else:  # an outage: said once, the next beat may land
                self._outage.lost(exc)


@contextmanager
def one_job_beats(
    worker: SteadyLoop,
    job: Job,
    rq_beat: Callable[[], None] | None,
    rq_every: float,
    *,
    alive: AliveFile | None,
) -> Iterator[None]:
    """:class:`JobBeats` for one job, its thread ended with it.

    For the forking worker's horse, a process that lives one job.
    """
    beats = JobBeats(worker, alive=alive)
    try:
        with beats.running(job, rq_beat, rq_every):
            yield
    finally:
        beats.close()


class FleetSimpleWorker(FairDequeue, SteadyLoop, LeanBeats, LeanSuccess, SimpleWorker):
    """Runs jobs in its own process (no fork), with its Fleet and live heartbeats."""

    fleet: Fleet | None = None

    def work(self, *args: Any, **kwargs: Any) -> bool:
        with unconfirmed():  # the loop's own writes (build_worker)
            return bool(super().work(*args, **kwargs))

    def validate_queues(self) -> None:
        _any_rq_queues(self.queues)

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        # Like the forking Worker (short TTL, refreshed by JobBeats), not
        # SimpleWorker's "job timeout + 60 s, set once".
        return BaseWorker.get_heartbeat_ttl(self, job, working_time)

    def perform_job(self, job: Job, queue: Queue, execution: Execution) -> bool:
        if isinstance(job, FleetJob):
            job.fleet = self.fleet

        def rq_beat() -> None:
            self.maintain_heartbeats(job, execution)

        with self.job_beats().running(job, rq_beat, float(self.job_monitoring_interval)):
            ok = bool(super().perform_job(job, queue, execution))
        _count_job(self.fleet, job, ok)
        return ok

    def job_beats(self) -> JobBeats:
        """This worker's one heartbeat thread's owner (made on the first job)."""
        beats: JobBeats | None = getattr(self, "_job_beats", None)
        if beats is None:
            beats = self._job_beats = JobBeats(self, alive=self.alive)
        return beats

    def teardown(self) -> None:
        beats: JobBeats | None = getattr(self, "_job_beats", None)
        if beats is not None:
            beats.close()
        super().teardown()


class FleetForkWorker(FairDequeue, SteadyLoop, LeanBeats, LeanSuccess, Worker):
    """Forks a work horse per job (RQ's default).

    The parent keeps RQ's heartbeats (and the alive file: its monitor kills a hung
    horse). The horse writes the vmpool heartbeat, so it stops exactly when the job's
    process dies.
    """

    fleet: Fleet | None = None

    def work(self, *args: Any, **kwargs: Any) -> bool:
        with unconfirmed():  # the loop's own writes (build_worker)
            return bool(super().work(*args, **kwargs))

    def validate_queues(self) -> None:
        _any_rq_queues(self.queues)

    def perform_job(self, job: Job, queue: Queue, execution: Execution) -> bool:
        if isinstance(job, FleetJob):
            job.fleet = self.fleet
        with one_job_beats(self, job, None, 0.0, alive=None):
            ok = bool(super().perform_job(job, queue, execution))
        _count_job(self.fleet, job, ok)  # in the horse: the counter lives in Redis
        return ok


def _any_rq_queues(queues: Sequence[Queue]) -> None:
    """Accept plain RQ queues where RQ wants ``queue_class`` ones.

    The dequeue of ``queue_class`` is a class method, so a plain ``Queue`` listens just
    as well (callers and tests build plain ones).
    """
    for queue in queues:
        if not isinstance(queue, Queue):
            raise TypeError(f"{queue!r} is not an RQ Queue")


def _count_job(fleet: Fleet | None, job: Job, ok: bool) -> None:
    """Count one finished job for /metrics (``vmpool_worker_jobs``), in Redis.

    In Redis, so every worker process, forked horses included, adds to the same counters.
    """
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

    ``queues``: RQ queue names (default: all of the fleet's, in listening order).
    ``config`` None builds a worker without a Fleet (benchmarks of no-op jobs only).
    ``alive``: the file to touch while the loop lives (workers/loop.py).
    The loop's own writes (dequeue, heartbeats, job counters) are ``unconfirmed``: a
    failover that loses one runs a job again or late. Each job confirms its own.
    """
    cls = WORKER_CLASSES[kind]
    keys = Keys(config.key_prefix if config else DEFAULT_PREFIX)
    if queues is None:
        queues = queue_names(keys)
    options = config.redis_options if config else default_redis_options()
    conn = connect(redis_url, options, decode_responses=False)  # bytes, as RQ requires
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
    worker.redis_check = writable_check(conn, keys)
    if config is not None:
        fleet = build_fleet(redis_url, config, conn, f"worker:{name}", queues)
        try:
            # Its scripts composed and on the server before its first job.
            own = [pop_script(conn)]
            if isinstance(fleet.dispatch, BatchDispatcher):
                own += fleet.dispatch.scripts
            fleet.warm(own)
        except redis.RedisError as exc:  # its first calls load them, as they always could
            log.warning("scripts not loaded at start: %s", exc)
        if isinstance(worker, FleetSimpleWorker | FleetForkWorker):
            worker.fleet = fleet
    return worker
