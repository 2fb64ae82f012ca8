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
  suspended waits in RQ's own loop, as stock RQ's does.

So the worker's hash is at most :data:`BEAT_EVERY_S` behind, far inside the freshness
that RQ and ``/metrics`` judge a worker by (``worker_ttl``, 30 s), and its key's TTL is
still renewed well before it runs out (65 s and more).

:class:`LeanJob`: a job's deletion reads its executions once, not once for the started
registry and once more for the execution registry.
"""

from __future__ import annotations

import time
from typing import Any, Final

from redis.client import Pipeline
from rq.executions import Execution, ExecutionRegistry
from rq.job import Job
from rq.worker.base import BaseWorker

__all__ = ["BEAT_EVERY_S", "LeanBeats", "LeanJob"]

# The least time between two writes of the same heartbeat or state of a worker.
BEAT_EVERY_S: Final = 1.0


class LeanBeats(BaseWorker):
    """RQ's heartbeat, state and suspension round trips, a repeat within :data:`BEAT_EVERY_S`
    skipped."""

    _beat_at: float | None = None  # monotonic time of the last heartbeat written
    _state_at: tuple[str, float] | None = None  # the last state written, and when
    _running_at: float | None = None  # monotonic time of the last read finding no suspension

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
            return
        super().check_for_suspension(burst)  # returns once the workers are not suspended
        self._running_at = time.monotonic()


class _ReadOnce(ExecutionRegistry):
    """A job's execution registry whose executions are read once."""

    _read: list[Execution] | None = None

    def get_executions(self, start: int = 0, end: int = -1) -> list[Execution]:
        if (start, end) != (0, -1):
            return super().get_executions(start, end)
        if self._read is None:
            self._read = super().get_executions()
        return list(self._read)


class LeanJob(Job):
    """An RQ job whose deletion reads its executions once."""

    _registry: _ReadOnce | None = None

    @property
    def execution_registry(self) -> ExecutionRegistry:
        if self._registry is not None:
            return self._registry
        return ExecutionRegistry(self.id, connection=self.connection)

    def delete(self, *args: Any, **kwargs: Any) -> None:
        self._registry = _ReadOnce(self.id, connection=self.connection)
        try:
            super().delete(*args, **kwargs)
        finally:
            self._registry = None
