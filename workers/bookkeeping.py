"""RQ's per-job bookkeeping without the round trips that repeat what was just written.

Around each job RQ's loop writes the worker's heartbeat four times (before the pop,
after it, after the job, and with the suspension check), three commands each, three
round trips when not on a pipeline. It writes the worker's state ``idle`` twice (after
the job, and again at the top of the dequeue), and the job's deletion reads the job's
executions twice (three round trips each). At a few milliseconds of work per job, those
repeats were most of a worker's Redis round trips, and of its CPU.

:class:`LeanBeats` (a worker mix-in, below the loop's guards in the MRO):

- a heartbeat with RQ's default TTL is skipped when one was written less than
  :data:`BEAT_EVERY_S` ago. A heartbeat with an explicit TTL (the job's start, the
  beats while a job runs) is always written. A written one goes out in one round trip.
- a state already written less than :data:`BEAT_EVERY_S` ago is not written again.
- the suspension flag (``rq suspend``), read by stock RQ at the top of every turn of the
  loop (a MULTI/EXISTS/EXEC round trip per job), is read again only
  :data:`BEAT_EVERY_S` after a read that found the workers not suspended. So a
  suspension stops a busy worker's next job at most that much later; a worker found
  suspended waits in RQ's own loop, as stock RQ's does. A read skipped at the top of a
  turn is made before the worker waits for a job (its queues found empty), so a
  suspension set just before the worker's last job still parks it once it is idle,
  not after whatever job comes next.

So the worker's hash is at most :data:`BEAT_EVERY_S` behind, far inside the freshness
that RQ and ``/metrics`` judge a worker by (``worker_ttl``, 30 s), and its key's TTL is
still renewed well before it runs out (65 s and more).

:class:`LeanSuccess`: the success of vmpool's own plain jobs in one transaction, without
RQ's read of their dependents and the last heartbeat of a hash it deletes (see there).

:class:`LeanJob`: a job's deletion reads its executions once, not once for the started
registry and once more for the execution registry, and in one round trip (the expired
ones dropped and the ids read, pipelined) when the only one is the execution the worker
just ran (:attr:`LeanJob.ran`, set by :class:`LeanBeats`): its fields are known, so it is
not read back. Stock RQ takes three round trips for that one execution, and one more
for each other.
"""

from __future__ import annotations

import time
from typing import Any, Final

from redis.client import Pipeline
from rq.executions import Execution, ExecutionRegistry
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.utils import as_text, current_timestamp, now
from rq.worker.base import BaseWorker

__all__ = ["BEAT_EVERY_S", "VMPOOL_JOBS", "LeanBeats", "LeanJob", "LeanSuccess"]

# The least time between two writes of the same heartbeat or state of a worker.
BEAT_EVERY_S: Final = 1.0
# The module prefix of vmpool's job functions (workers/jobs.py; not imported: it imports
# the worker).
VMPOOL_JOBS: Final = "workers.jobs."


class LeanBeats(BaseWorker):
    """RQ's heartbeat, state and suspension round trips, a repeat within :data:`BEAT_EVERY_S`
    skipped."""

    _beat_at: float | None = None  # monotonic time of the last heartbeat written
    _state_at: tuple[str, float] | None = None  # the last state written, and when
    _running_at: float | None = None  # monotonic time of the last read finding no suspension
    _check_owed = False  # the last check was skipped: read the flag before a wait for a job

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        now = time.monotonic()
        if timeout is None and self._beat_at is not None and now - self._beat_at < BEAT_EVERY_S:
            return
        if pipeline is not None:
            super().heartbeat(timeout, pipeline)
        else:
            with self.connection.pipeline(transaction=False) as pipe:
                super().heartbeat(timeout, pipe)
                pipe.execute()
        self._beat_at = now

    def set_state(self, state: str, pipeline: Pipeline | None = None) -> None:
        # Every write of the state passes here, so the one last written is the one held.
        now = time.monotonic()
        if pipeline is None and self._state_at is not None:
            written, at = self._state_at
            if written == state and now - at < BEAT_EVERY_S:
                return
        super().set_state(state, pipeline)
        self._state_at = (state, now)

    def check_for_suspension(self, burst: bool) -> None:
        now = time.monotonic()
        if self._running_at is not None and now - self._running_at < BEAT_EVERY_S:
            self._check_owed = not burst  # a burst worker never waits for a job
            return
        self._check_owed = False
        super().check_for_suspension(burst)  # returns once the workers are not suspended
        self._running_at = time.monotonic()

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        # A check skipped at the top of this turn is made before the worker waits for a
        # job: a suspension it missed would otherwise be seen only after the next job,
        # however late that comes. A pop first, so a busy worker skips it still.
        if self._check_owed and timeout is not None:
            found = super().dequeue_job_and_maintain_ttl(None, max_idle_time)  # no wait
            if found is not None:
                return found
            self._running_at = None
            self.check_for_suspension(False)  # the whole loop's, with its guard
        return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)

    def perform_job(self, job: Job, queue: Queue, execution: Execution) -> bool:
        if isinstance(job, LeanJob):
            job.ran = execution
        return bool(super().perform_job(job, queue, execution))


class LeanSuccess(BaseWorker):
    """RQ's record of a job's success, without the dependents' read for a plain job.

    Stock RQ WATCHes the finished job's dependents set and reads it (two round trips)
    to move the jobs that waited for it to their queues, whatever the job. vmpool's own
    jobs (functions of :data:`VMPOOL_JOBS`) have no dependents: vmpool enqueues none with
    ``depends_on`` (workers/queues.py, workers/schedule.py). So the success of a plain
    one (a :class:`LeanJob` keeping no result, not repeated, not rate limited, no
    success callback) is one transaction: the worker's counters, the job deleted, its
    execution cleaned up, as stock RQ's transaction writes them for such a job. Any
    other job goes RQ's way.

    The job's last heartbeat, which RQ writes to its hash as soon as it ends (a round
    trip), waits for the outcome: dropped when that is a plain job's success (the
    transaction deletes the hash), written first on any other way on (RQ's success,
    a retry, a failure).
    """

    def handle_execution_ended(self, job: Job, queue: Queue, heartbeat_ttl: int) -> None:
        if not (isinstance(job, LeanJob) and _plain_kind(job, self.default_result_ttl)):
            super().handle_execution_ended(job, queue, heartbeat_ttl)
            return
        job.ended_at = now()
        job.last_heartbeat = job.ended_at
        job.beat_due = heartbeat_ttl

    def handle_job_retry(self, job: Job, *args: Any, **kwargs: Any) -> None:
        _beat_if_due(job)
        super().handle_job_retry(job, *args, **kwargs)

    def handle_job_failure(self, job: Job, *args: Any, **kwargs: Any) -> None:
        _beat_if_due(job)
        super().handle_job_failure(job, *args, **kwargs)

    def handle_job_success(
        self,
        job: Job,
        queue: Queue,
        started_job_registry: Any,
        execution: Execution,
    ) -> None:
        if not _plain(job, self.default_result_ttl):
            _beat_if_due(job)
            super().handle_job_success(job, queue, started_job_registry, execution)
            return
        if isinstance(job, LeanJob):
            job.beat_due = None  # the hash is deleted below
        assert job.started_at is not None and job.ended_at is not None
        with self.connection.pipeline() as pipe:
            pipe.multi()
            self.increment_successful_job_count(pipeline=pipe)
            self.increment_total_working_time(job.ended_at - job.started_at, pipe)
            job.cleanup(0, pipeline=pipe, remove_from_queue=False)
            self.cleanup_execution(job, pipeline=pipe, execution=execution)
            pipe.execute()
        what = job.description if self.log_job_description else job.id
        taken = job.ended_at - job.started_at
        self.log.info("Successfully completed %s job in %ss on worker %s", what, taken, self.name)


def _plain(job: Job, default_result_ttl: int) -> bool:
    """Whether ``job``'s success needs none of RQ's bookkeeping beyond its deletion."""
    return (
        isinstance(job, LeanJob)
        and job.get_status(refresh=False) == JobStatus.FINISHED
        and _plain_kind(job, default_result_ttl)
    )


def _plain_kind(job: Job, default_result_ttl: int) -> bool:
    """Whether ``job`` is one of vmpool's whose success leaves nothing of it."""
    return (
        (job.func_name or "").startswith(VMPOOL_JOBS)
        and job.get_result_ttl(default_result_ttl) == 0
        and job.repeats_left is None
        and not job.has_rate_limit
        and job.success_callback is None
    )


def _beat_if_due(job: Job) -> None:
    """Write the last heartbeat :meth:`LeanSuccess.handle_execution_ended` held back."""
    if isinstance(job, LeanJob) and job.beat_due is not None and job.last_heartbeat:
        ttl, job.beat_due = job.beat_due, None
        job.heartbeat(job.last_heartbeat, ttl)


class _ReadOnce(ExecutionRegistry):
    """A job's execution registry whose executions are read once, ``known`` not read back."""

    def __init__(self, job_id: str, connection: Any, known: Execution | None) -> None:
        super().__init__(job_id, connection)
        self._known = {known.id: known} if known is not None else {}
        self._read: list[Execution] | None = None

    def get_executions(self, start: int = 0, end: int = -1) -> list[Execution]:
        if (start, end) != (0, -1):
            return super().get_executions(start, end)
        if self._read is None:
            self._read = self._read_all()
        return list(self._read)

    def _read_all(self) -> list[Execution]:
        """RQ's read (expired ids dropped, then each id's hash), the known one not read."""
        with self.connection.pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(self.key, 0, current_timestamp())
            pipe.zrange(self.key, 0, -1)
            ids = [as_text(i) for i in pipe.execute()[1]]
        others = [i for i in ids if i not in self._known]
        if others:
            with self.connection.pipeline(transaction=False) as pipe:
                for i in others:
                    pipe.hgetall(Execution(i, self.job_id, self.connection).key)
                hashes = dict(zip(others, pipe.execute(), strict=True))
        read = {**self._known}
        for i in others:
            if not hashes[i]:  # as Execution.fetch, which RQ's read uses
                raise ValueError(f"Execution {i} not found in Redis")
            read[i] = Execution(i, self.job_id, self.connection)
            read[i].restore(hashes[i])
        return [read[i] for i in ids]


class LeanJob(Job):
    """An RQ job whose deletion reads its executions once, the one it ran not read back."""

    _registry: _ReadOnce | None = None
    ran: Execution | None = None  # the execution of this job the worker ran
    beat_due: int | None = None  # the TTL of a last heartbeat not written yet (LeanSuccess)

    @property
    def execution_registry(self) -> ExecutionRegistry:
        if self._registry is not None:
            return self._registry
        return ExecutionRegistry(self.id, connection=self.connection)

    def delete(self, *args: Any, **kwargs: Any) -> None:
        self._registry = _ReadOnce(self.id, self.connection, self.ran)
        try:
            super().delete(*args, **kwargs)
        finally:
            self._registry = None
