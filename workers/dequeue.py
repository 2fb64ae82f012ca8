"""The vmpool worker's dequeue: pop a job and stamp its heartbeat in one unit.

RQ pops with BLPOP (or BLMOVE for one queue) and marks the job started later, in another
round trip. A worker killed in between (or one that lost the pop's reply with its
connection) leaves a hash that says ``queued`` while its id is in no queue. Telling that
apart from a job still waiting would take an LPOS over the whole queue for every
duplicate the sweeps meet: Redis time quadratic in the backlog.

:class:`StampingQueue` pops through ``pop_job.lua`` instead: the id leaves its queue
together with the vmpool heartbeat on its hash, so ``reclaim_job.lua`` decides in O(1)
(a ``queued`` hash without a beat is queued, and with a stale beat its popper died).

Blocking: Lua cannot block, so an idle worker polls, backing off from
:data:`POLL_MIN_S` to :data:`POLL_MAX_S` (one cheap script per poll: at most 20 per
second per idle worker), until RQ's dequeue timeout. A job queued while a worker idles
waits at most :data:`POLL_MAX_S` for it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

from redis import Redis
from rq import Queue
from rq.exceptions import DequeueTimeout

from vmpool.state.keys import Keys
from vmpool.state.lua import read_script
from workers.queues import HEARTBEAT_FIELD

__all__ = ["POLL_MAX_S", "POLL_MIN_S", "StampingQueue", "pop_job"]

POLL_MIN_S: Final = 0.005
POLL_MAX_S: Final = 0.05

_POP_LUA: Final = read_script("workers", "pop_job.lua")


def pop_job(conn: Redis, queue_keys: Sequence[str]) -> tuple[Any, Any] | None:
    """One pop over ``queue_keys`` in order: (queue key, job id) or None if all empty."""
    script = conn.register_script(_POP_LUA)
    found = script(keys=list(queue_keys), args=[Keys.rq_job(""), HEARTBEAT_FIELD])
    if not found:
        return None
    return found[0], found[1]


class StampingQueue(Queue):
    """An RQ queue class whose dequeue is :func:`pop_job` (see the module docstring)."""

    @classmethod
    def lpop(
        cls, queue_keys: Sequence[str], timeout: int | None, connection: Redis | None = None
    ) -> Any:
        assert connection is not None
        if timeout is not None and timeout <= 0:
            raise ValueError("RQ does not support indefinite timeouts")
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = POLL_MIN_S
        while True:
            found = pop_job(connection, queue_keys)
            if found is not None or deadline is None:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise DequeueTimeout(timeout, queue_keys)
            time.sleep(min(delay, left))
            delay = min(2 * delay, POLL_MAX_S)

    @classmethod
    def lmove(cls, connection: Redis, queue_key: str, timeout: int | None) -> Any:
        # RQ's one-queue path (BLMOVE to an intermediate list) pops unstamped too.
        return cls.lpop([queue_key], timeout, connection=connection)
