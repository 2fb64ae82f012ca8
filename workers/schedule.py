"""The periodic work: rq-scheduler puts each sweep on the queues at its config interval.

The schedule (``:schedule:`` in the config, seconds; docs/architecture.md):

=======================  ===================  =========================================
job                      interval field       what it finds
=======================  ===================  =========================================
``sweep``                ``sweep``            pending requests past their TTL (+ grace)
``provision-sweep``      ``provision``        requests with unreserved slots
``check-pending-sweep``  ``check_pending``    VMs booting: ready yet? timed out?
``reap``                 ``reap``             running VMs past their lifetime
``destroy-sweep``        ``destroy``          completed VMs still to destroy
``reconcile``            ``reconcile``        provider inventory against the records
=======================  ===================  =========================================

How replicas share it. Every replica writes the same six *templates* at start: RQ job
hashes with fixed ids ``schedule-<job>`` in one sorted set (score = next run, Redis
server time), added with ``NX`` so a restart does not push the next run back. Each tick
(``--interval``, default 1 s) a replica takes rq-scheduler's per-tick lock
(``SET NX EX interval+10``), moves every due template and releases the lock. Moving a
template does not enqueue the template itself (stock rq-scheduler would push that one
job id again and again); it calls :func:`workers.queues.enqueue` for the sweep, which is
``unique``: even two replicas ticking at once (the lock's DEL does not check its owner,
so a replica paused past the lock TTL can release another's lock) enqueue each sweep at
most once, and a sweep still queued or running is not queued again. The next run is
``now + interval`` from the tick that moved it, so a stall never causes a burst.

A replica SIGKILLed while it holds the lock stalls the schedule for at most
``interval + 10`` s (11 s with the default 1 s tick); one killed between ticks costs
nothing: the others keep ticking. Each move is logged to a capped list
(:data:`SCHEDULE_LOG`, newest first: ``<server time> <job> <enqueued 0|1> <replica>``)
for operators and for the tests that prove "never doubled, never stopped".
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

import redis
from rq.job import Job
from rq_scheduler import Scheduler

from workers.queues import JOBS, QUEUE_SWEEPS, enqueue

if TYPE_CHECKING:
    from vmpool.config import Schedule

__all__ = [
    "PERIODIC",
    "SCHEDULE_LOG",
    "FleetScheduler",
    "read_schedule_log",
    "schedule_intervals",
]

log = logging.getLogger(__name__)

# job name -> the Schedule field that holds its interval
PERIODIC: Final[dict[str, str]] = {
    "sweep": "sweep",
    "provision-sweep": "provision",
    "check-pending-sweep": "check_pending",
    "reap": "reap",
    "destroy-sweep": "destroy",
    "reconcile": "reconcile",
}

SCHEDULE_LOG: Final = "rq:scheduler:vmpool:log"
_LOG_LENGTH: Final = 2000


def schedule_intervals(schedule: Schedule) -> dict[str, float]:
    """Seconds between runs, per periodic job."""
    return {job: float(getattr(schedule, field)) for job, field in PERIODIC.items()}


class FleetScheduler(Scheduler):  # type: ignore[misc]
    """rq-scheduler with vmpool's keys, server time and deduplicated enqueues."""

    redis_scheduler_namespace_prefix = "rq:scheduler_instance:vmpool:"
    scheduler_key = "rq:scheduler:vmpool"
    scheduler_lock_key = "rq:scheduler_lock:vmpool"
    scheduled_jobs_key = "rq:scheduler:vmpool:scheduled_jobs"

    def __init__(self, connection: redis.Redis, interval: float = 1.0, **kwargs: Any) -> None:
        super().__init__(
            queue_name=QUEUE_SWEEPS, connection=connection, interval=interval, **kwargs
        )

    def _now(self) -> float:
        sec, usec = self.connection.time()
        return float(sec) + float(usec) / 1_000_000

    def install(self, intervals: dict[str, float]) -> None:
        """Write the templates (idempotent; every replica does it at start)."""
        now = self._now()
        for job, seconds in intervals.items():
            if job not in JOBS or seconds <= 0:
                raise ValueError(f"bad periodic job {job!r} every {seconds!r} s")
            template = self._create_job(
                "workers.jobs.noop",
                id=f"schedule-{job}",
                commit=False,
                result_ttl=-1,
                description=f"every {seconds:g} s: enqueue {job}",
                meta={"vmpool_job": job, "vmpool_interval": seconds},
            )
            template.save()
            self.connection.zadd(self.scheduled_jobs_key, {template.id: now}, nx=True)

    def get_jobs_to_queue(self, with_times: bool = False) -> Iterator[Any]:
        # Server time, sub-second (stock: the local clock, whole seconds).
        return self.get_jobs(self._now(), with_times=with_times)  # type: ignore[no-any-return]

    def enqueue_job(self, job: Job) -> None:
        name = job.meta.get("vmpool_job")
        interval = float(job.meta.get("vmpool_interval") or 0)
        if name not in JOBS or interval <= 0:
            log.warning("dropping unknown schedule entry %s", job.id)
            self.cancel(job.id)
            return
        enqueued = enqueue(self.connection, name)
        now = self._now()
        with self.connection.pipeline() as pipe:
            pipe.zadd(self.scheduled_jobs_key, {job.id: now + interval})
            pipe.lpush(SCHEDULE_LOG, f"{now:.3f} {name} {int(enqueued)} {self.name}")
            pipe.ltrim(SCHEDULE_LOG, 0, _LOG_LENGTH - 1)
            pipe.execute()
        log.debug("%s: %s", name, "enqueued" if enqueued else "already queued")


def read_schedule_log(conn: redis.Redis) -> list[tuple[float, str, bool, str]]:
    """The schedule log, oldest first: (server time, job, enqueued, replica)."""
    rows: list[tuple[float, str, bool, str]] = []
    for raw in reversed(conn.lrange(SCHEDULE_LOG, 0, -1)):
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        when, job, enqueued, replica = text.split(" ", 3)
        rows.append((float(when), job, enqueued == "1", replica))
    return rows
