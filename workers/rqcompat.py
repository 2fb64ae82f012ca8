"""RQ's and rq-scheduler's private names, behind this one module.

vmpool needs a few things RQ offers only under private names. Each is reached here and
given a public name, and nowhere else (tests/test_layout.py checks every other module):

- a job built as ``Queue.enqueue(..., unique=True)`` builds it, pushed by RQ's
  unique-enqueue script on a pipeline, so that many jobs cost one round trip
  (workers/queues.py): :func:`push_unique_job`;
- the worker's hooks vmpool changes (workers/loop.py, workers/turns.py): the connection
  it keeps, the handler of an error in its pubsub thread, the stop flag its loop checks
  and the order its next pop tries its queues in: :class:`WorkerHooks`;
- rq-scheduler's job builder (workers/schedule.py):
  :class:`SchedulerHooks`.

:data:`PRIVATE_NAMES` lists each private name this module relies on, with the
parameters it calls or overrides it with. tests/test_rqcompat.py holds each against the
installed RQ, so an RQ whose private names moved fails the tests rather than a worker
(pyproject.toml pins rq to one minor release for the same reason).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from redis import Redis
from redis.client import Pipeline, PubSub, PubSubWorkerThread
from redis.commands.core import Script
from rq import Queue
from rq import scripts as rq_scripts
from rq.job import Job
from rq.worker.base import BaseWorker
from rq_scheduler import Scheduler

from vmpool.state.lua import evalsha_on

__all__ = ["PRIVATE_NAMES", "PrivateName", "SchedulerHooks", "WorkerHooks", "push_unique_job"]


@dataclass(frozen=True)
class PrivateName:
    """One private name of RQ (or rq-scheduler) this module relies on, as it does."""

    owner: Any  # the module or class that defines it
    name: str
    # A function's parameters (their names, space-separated), as this module calls or
    # overrides it. None: an instance attribute, set by the owner's __init__.
    parameters: str | None


PRIVATE_NAMES: Final = (
    PrivateName(rq_scripts, "_build_hset_args", "job"),
    PrivateName(Queue, "_prepare_for_queue", "self job"),
    PrivateName(BaseWorker, "_set_connection", "self connection"),
    PrivateName(BaseWorker, "_pubsub_exception_handler", "self exc pubsub pubsub_thread"),
    PrivateName(BaseWorker, "_stop_requested", None),
    PrivateName(BaseWorker, "_ordered_queues", None),
    PrivateName(
        Scheduler,
        "_create_job",
        "self func args kwargs commit result_ttl ttl id description queue_name timeout meta"
        " depends_on on_success on_failure",
    ),
)


def push_unique_job(pipeline: Pipeline, script: Script, queue: Queue, job: Job) -> None:
    """Queue ``job`` on ``queue`` as ``Queue.enqueue(..., unique=True)`` does, on ``pipeline``.

    ``job`` is one ``queue.create_job`` made. It is readied for its queue as RQ readies
    it (origin, enqueue time, status), and ``script`` (RQ's ``UNIQUE_ENQUEUE_SCRIPT``,
    registered) saves its hash and pushes its id unless a hash of that id exists: its
    reply in the pipeline's is 1 when queued, 0 for a duplicate. A bare EVALSHA: the
    pipeline runs by :func:`vmpool.state.lua.execute_loading`.
    """
    queue._prepare_for_queue(job)
    fields: list[Any] = rq_scripts._build_hset_args(job)  # type: ignore[no-untyped-call]
    ttl = job.ttl if job.ttl is not None else -1
    evalsha_on(pipeline, script, [job.key, queue.key], [job.id, "R", ttl, *fields])


class WorkerHooks(BaseWorker):
    """RQ's worker with the private hooks vmpool changes under public names."""

    def worker_connection(self, connection: Redis) -> Redis:
        """The connection the worker keeps, made at its start.

        RQ's raises the socket timeout to the dequeue timeout + 10 s, for a blocking pop.
        """
        return super()._set_connection(connection)  # type: ignore[no-any-return]

    def _set_connection(self, connection: Redis) -> Redis:
        return self.worker_connection(connection)

    def pubsub_error(
        self, exc: Exception, pubsub: PubSub, pubsub_thread: PubSubWorkerThread
    ) -> None:
        """An error in the thread that listens for commands to the worker.

        RQ's logs a lost connection and sleeps 2 s (redis-py resubscribes once connected
        again), and raises anything else.
        """
        super()._pubsub_exception_handler(exc, pubsub, pubsub_thread)

    def _pubsub_exception_handler(
        self, exc: Exception, pubsub: PubSub, pubsub_thread: PubSubWorkerThread
    ) -> None:
        self.pubsub_error(exc, pubsub, pubsub_thread)

    @property
    def stop_requested(self) -> bool:
        """Whether a stop was requested: RQ's loop ends at the top of its next turn."""
        return bool(self._stop_requested)

    @stop_requested.setter
    def stop_requested(self, value: bool) -> None:
        self._stop_requested = value

    @property
    def pop_order(self) -> list[Queue]:
        """The worker's queues in the order its next dequeue tries them.

        RQ sets it to the listening order and reorders it after each job by its dequeue
        strategy (``reorder_queues``).
        """
        return list(self._ordered_queues)

    @pop_order.setter
    def pop_order(self, queues: list[Queue]) -> None:
        self._ordered_queues = queues


class SchedulerHooks(Scheduler):  # type: ignore[misc]
    """rq-scheduler's Scheduler with the private methods vmpool calls under public names."""

    def create_template(
        self, func: str, job_id: str, description: str, meta: dict[str, Any]
    ) -> Job:
        """An unsaved job of ``func`` kept as rq-scheduler keeps a scheduled job.

        Status ``scheduled``, origin the scheduler's queue, results kept forever.
        """
        return self._create_job(  # type: ignore[no-any-return]
            func, id=job_id, commit=False, result_ttl=-1, description=description, meta=meta
        )
