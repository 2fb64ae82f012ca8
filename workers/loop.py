"""RQ's work loop kept running through a Redis outage, stopped only by a real error.

RQ's ``work()`` ends on any error in its own steps (the suspension check, the
maintenance pass, a heartbeat, the bookkeeping around a job): it logs "found an
unhandled exception, quitting" (or "Redis connection timeout, quitting") and returns
as if it were done. So a Redis restart or stall met at the wrong moment ended
`vmpool worker` with status 0 (25 such exits in the chaos soak), and Kubernetes
restarted the pod. :class:`SteadyLoop`, mixed into vmpool's worker classes, wraps
those steps: a Redis that is gone or refuses writes (out of memory, read-only after a
failover, too few replicas, writes not confirmed durable) is waited out in place, and
any other error is kept in ``fatal_error`` so the command exits 1 instead of 0. Waiting
out is a small write with backoff until one is taken, one warning per outage naming
why, one line when it is over, and the alive file touched meanwhile.

The alive file (:class:`AliveFile`) is the loop's liveness signal for Kubernetes
(``vmpool probe worker``): touched on every turn of the loop, every RQ heartbeat
(each dequeue timeout while idle, each second while suspended), while a job runs
(workers/worker.py) and while an outage is waited out.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, Final, TypeVar

import redis
from redis.client import Pipeline, PubSub, PubSubWorkerThread
from rq.exceptions import StopRequested
from rq.executions import Execution
from rq.job import Job
from rq.queue import Queue
from rq.worker.base import WorkerStatus

from vmpool.lifecycle.failpoints import failpoint
from vmpool.state.keys import Keys
from vmpool.state.redis_health import MESSAGES, RedisCondition, classify, probe
from workers.rqcompat import WorkerHooks

__all__ = [
    "PUBSUB_WAIT_S",
    "AliveFile",
    "RedisOutage",
    "SteadyLoop",
    "redis_unusable",
    "wait_for_redis",
    "writable_check",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_WAIT_DELAY_S: Final = 2.0  # how late a worker may notice Redis is back
# How long the thread that listens for commands to the worker waits for one before it
# looks at its stop flag again, so the longest a stop waits for that thread. RQ's wait
# is 60 s, and redis-py 8.2's PubSubWorkerThread.stop() joins the thread without a
# timeout: a worker could take a minute to exit. Below the 1 s RQ's teardown gives the
# thread (redis-py 8.1), so the thread has closed its connection before RQ closes it
# again (two closes at once fail in the thread).
PUBSUB_WAIT_S: Final = 0.5


def redis_unusable(exc: BaseException) -> RedisCondition | None:
    """Why ``exc`` says Redis cannot be used now (to be waited out), else None (fatal).

    Redis going away (a restart, a failover, a
    dropped connection, a stall past the socket timeout, an AOF replay) and Redis
    refusing writes (full, read-only, too few replicas, a write not confirmed durable)
    are both outages: :mod:`vmpool.state.redis_health`.
    """
    return classify(exc) if isinstance(exc, redis.RedisError) else None


class AliveFile:
    """A file whose modification time is the worker loop's last sign of life."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._warned = False

    def touch(self) -> None:
        try:
            self.path.touch()
        except OSError as exc:  # the probe will say so. The loop itself goes on
            if not self._warned:
                self._warned = True
                log.warning("cannot touch the alive file %s: %s", self.path, exc)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


class RedisOutage:
    """One warning when Redis becomes unusable, and one line when it takes writes again.

    The warning names why (unreachable, out of memory, read-only, ...), however many
    threads and attempts meet the outage in between. ``who``: "worker NAME",
    "scheduler NAME".
    """

    def __init__(self, who: str) -> None:
        self.who = who
        self._since: float | None = None
        self._lock = threading.Lock()

    def lost(self, exc: BaseException) -> None:
        with self._lock:
            if self._since is None:
                self._since = time.monotonic()
                condition = redis_unusable(exc) or RedisCondition.UNREACHABLE
                reason = " ".join(str(exc).split()) or type(exc).__name__
                log.warning(
                    "%s: lost Redis: %s (%s); waiting for it", self.who, MESSAGES[condition], reason
                )

    def back(self) -> None:
        if self._since is None:  # the common case, without the lock
            return
        with self._lock:
            if self._since is not None:
                log.warning(
                    "%s: Redis is back after %.1f s", self.who, time.monotonic() - self._since
                )
                self._since = None


def wait_for_redis(
    check: Callable[[], RedisCondition], *, tick: Callable[[], None] | None = None
) -> None:
    """Block until ``check`` finds Redis taking writes, with a growing delay.

    ``check``: a write probe (:func:`writable_check`). ``tick`` runs before each attempt
    (it may raise to stop waiting).
    """
    delay = 0.25
    while True:
        if tick is not None:
            tick()
        try:
            if check() is RedisCondition.OK:
                return
        except redis.RedisError:  # not an outage the probe knows: try again all the same
            log.debug("Redis probe failed", exc_info=True)
        time.sleep(delay)
        delay = min(MAX_WAIT_DELAY_S, delay * 2)


def writable_check(conn: redis.Redis, keys: Keys) -> Callable[[], RedisCondition]:
    """The check :func:`wait_for_redis` polls: a small write through ``conn``.

    ``conn`` is a client of the connection factory: its socket timeout bounds each attempt.
    """
    return partial(probe, conn, keys)


class SteadyLoop(WorkerHooks):
    """The steps of RQ's loop, guarded (see the module docstring)."""

    alive: AliveFile | None = None
    fatal_error: BaseException | None = None
    # How the loop tells Redis takes writes again (build_worker sets the write probe).
    # None: a PING.
    redis_check: Callable[[], RedisCondition] | None = None
    # RQ's dequeue sleeps up to this between two attempts, touching nothing (RQ: 60 s,
    # as long as the probe's max age).
    max_connection_wait_time = 10.0
    _patient = True  # False in burst mode: a run meant to end ends on a lost Redis

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outage = RedisOutage(f"worker {self.name}")

    def worker_connection(self, connection: redis.Redis) -> redis.Redis:
        # RQ raises the socket timeout to its dequeue timeout + 10 s (25 s here) for a
        # blocking pop. The vmpool dequeue blocks at most half the socket timeout at a
        # time (workers/dequeue.py) and nothing else blocks, so the connection
        # factory's timeout stays: a frozen connection is noticed in seconds, not after 25.
        return connection

    def check_for_suspension(self, burst: bool) -> None:
        # The top of every turn of the loop.
        self._patient = not burst
        self._touch_alive()
        self._guarded(partial(self._check_for_suspension, burst), again=True, default=None)

    def _check_for_suspension(self, burst: bool) -> None:
        failpoint("worker.loop")
        super().check_for_suspension(burst)

    def run_maintenance_tasks(self) -> None:
        step = super().run_maintenance_tasks
        self._guarded(step, again=False, default=None)  # skipped: the next pass comes

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        step = partial(super().dequeue_job_and_maintain_ttl, timeout, max_idle_time)
        return self._guarded(step, again=True, default=None)  # None would end the loop

    def execute_job(self, job: Job, queue: Queue) -> None:
        # Not run again after an outage: the sweeps find what this job left undone.
        self._guarded(partial(super().execute_job, job, queue), again=False, default=None)

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        # RQ beats each turn, each dequeue timeout and each suspended second. A job's
        # own thread (workers/worker.py) beats for the alive file by the job's budget.
        if threading.current_thread() is threading.main_thread():
            self._touch_alive()
            if self.stop_requested and self.get_state() != WorkerStatus.BUSY:
                raise StopRequested()  # a stop whose StopRequested was swallowed
        if pipeline is not None:  # only queued: whoever executes it meets Redis
            super().heartbeat(timeout, pipeline)
            return
        self._guarded(partial(super().heartbeat, timeout), again=True, default=None)

    def maintain_heartbeats(self, job: Job, execution: Execution) -> None:
        # While a job runs (the fork parent's monitor, the simple worker's job thread):
        # a missed beat is not worth ending the job's monitoring over.
        try:
            super().maintain_heartbeats(job, execution)
        except redis.RedisError as exc:
            if redis_unusable(exc) is None:
                raise
            self.outage.lost(exc)
        else:
            self.outage.back()

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        """RQ's start, a stop asked during it kept for the loop's first turn.

        RQ installs its signal handlers once its start is over (registered, subscribed):
        a SIGTERM before that took the default action, killing the worker with its
        registration left behind. Its own handlers replace this one after the start.
        """
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._stop_at_start)
        super().bootstrap(*args, **kwargs)

    def _stop_at_start(self, signum: int, frame: FrameType | None) -> None:
        self.stop_requested = True  # RQ's loop stops at the top of its first turn

    def subscribe(self) -> None:
        # RQ's, with the thread's wait PUBSUB_WAIT_S instead of 60 s: RQ's teardown stops
        # the thread and (redis-py 8.2) waits for it to end, which it does only once its
        # wait is over. Its errors go to pubsub_error, as RQ's do.
        failpoint("worker.start")
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()  # type: ignore[no-untyped-call]
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]
            sleep_time=PUBSUB_WAIT_S, daemon=True, exception_handler=self.pubsub_error
        )

    def pubsub_error(
        self, exc: Exception, pubsub: PubSub, pubsub_thread: PubSubWorkerThread
    ) -> None:
        # RQ's handler logs every 2 s of an outage. One warning is enough.
        if redis_unusable(exc) is None:
            super().pubsub_error(exc, pubsub, pubsub_thread)
            return
        self.outage.lost(exc)
        time.sleep(2.0)  # as RQ's: redis-py resubscribes once connected again

    def teardown(self) -> None:
        try:
            super().teardown()  # type: ignore[no-untyped-call]
        except redis.RedisError as exc:  # stopping while Redis is away: its key expires
            if redis_unusable(exc) is None:
                raise
            log.warning("worker %s: death not recorded (%s)", self.name, exc)

    def _guarded(self, step: Callable[[], T], *, again: bool, default: T) -> T:
        """Run ``step``. A lost Redis is waited out, other errors are fatal.

        After the wait the step runs ``again``, or ``default`` is returned. Any other
        error is kept as fatal and raised on.
        """
        while True:
            try:
                result = step()
            except StopRequested:
                raise
            except Exception as exc:
                if redis_unusable(exc) is None:
                    self.fatal_error = exc
                    raise
                self._wait_out(exc)
                if again:
                    continue
                return default
            # A later step that runs means RQ went on after that error: not fatal.
            self.fatal_error = None
            self.outage.back()
            return result

    def _wait_out(self, exc: Exception) -> None:
        if not self._patient:
            self.fatal_error = exc
            raise exc
        self.outage.lost(exc)
        wait_for_redis(self.redis_check or self._ping, tick=self.wait_tick)
        self.outage.back()

    def _ping(self) -> RedisCondition:
        try:
            self.connection.ping()
        except redis.RedisError as exc:
            return redis_unusable(exc) or RedisCondition.UNREACHABLE
        return RedisCondition.OK

    def wait_tick(self) -> None:
        """Touch the alive file, and raise StopRequested once a stop was requested.

        Run before each attempt of a wait for Redis.
        """
        self._touch_alive()
        if self.stop_requested:
            raise StopRequested()

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        # RQ's handler raises StopRequested wherever the main thread is. Inside a logging
        # handler's emit, logging swallows it. The flag outlives that: the wait for Redis
        # and the idle dequeue's heartbeat see it.
        self.stop_requested = True
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]

    def _touch_alive(self) -> None:
        if self.alive is not None:
            self.alive.touch()
