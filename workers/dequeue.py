"""The vmpool worker's dequeue: pop a job and stamp its heartbeat in one unit.

RQ pops with BLPOP (or BLMOVE for one queue) and marks the job started later, in another
round trip. A worker killed in between (or one that lost the pop's reply with its
connection) leaves a hash that says ``queued`` while its id is in no queue. Telling that
apart from a job still waiting would take an LPOS over the whole queue for every
duplicate the sweeps meet: Redis time quadratic in the backlog.

:class:`StampingQueue` pops through ``pop_job.lua`` instead: the id leaves its queue
together with the vmpool heartbeat on its hash, so ``reclaim_job.lua`` decides in O(1)
(a ``queued`` hash without a beat is queued, and with a stale beat its popper died).

Blocking: Lua cannot block, so a worker whose queues are empty blocks beside the pop,
on the queues' wake-up lists (``BLPOP``, :meth:`vmpool.state.keys.Keys.rq_queue_wake`),
and pops again once woken. Every push of vmpool's (:func:`workers.queues.push_unique`:
the sweeps, the dispatchers, the scheduler) puts a token in its queue's list in the
same pipeline, and the pop that leaves jobs behind puts one there for the next idle
worker (``pop_job.lua``). So an idle worker sends a few commands every
:data:`WAKE_WAIT_S`, not a poll every 5 to 50 ms, and a job pushed while it waits is
popped one round trip later. No wake-up is lost: the pop that finds every queue
empty drops their tokens in the same unit, so any push after it leaves a token the
worker's block returns on. A job pushed another way (RQ's own ``enqueue``, a requeue
from a dashboard) has no token: a worker's block ends every :func:`wake_wait_s` (at
most :data:`WAKE_WAIT_S`) and pops again, so such a job waits that long at most.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

from redis import Redis
from redis.commands.core import Script
from rq import Queue
from rq.exceptions import DequeueTimeout

from vmpool.state.keys import Keys
from vmpool.state.lua import read_script
from workers.queues import HEARTBEAT_FIELD

__all__ = ["WAKE_WAIT_S", "StampingQueue", "pop_job", "pop_script", "wake_wait_s"]

# The longest block on the wake-up lists before the worker pops again: the most a job
# pushed without a token waits for an idle worker. Each costs an idle worker a BLPOP and
# a pop (6 Redis commands with 3 queues).
WAKE_WAIT_S: Final = 2.0

_POP_LUA: Final = read_script("workers", "pop_job.lua")


def pop_script(conn: Redis) -> Script:
    """The pop's script on ``conn`` (for :func:`~vmpool.state.lua.load_missing`)."""
    return conn.register_script(_POP_LUA)


def pop_job(conn: Redis, queue_keys: Sequence[str]) -> tuple[Any, Any] | None:
    """One pop over ``queue_keys`` in order: (queue key, job id) or None if all empty.

    None also drops the queues' wake-up tokens (pop_job.lua).
    """
    script = pop_script(conn)
    keys = [*queue_keys, *_wake_keys(queue_keys)]
    found = script(keys=keys, args=[Keys.rq_job(""), HEARTBEAT_FIELD])
    if not found:
        return None
    return found[0], found[1]


def wake_wait_s(conn: Redis) -> float:
    """How long one block on the wake-up lists lasts: :data:`WAKE_WAIT_S`.

    At most half the connection's socket timeout, so a block is never taken for a dead
    connection.
    """
    timeout = conn.connection_pool.connection_kwargs.get("socket_timeout")
    return WAKE_WAIT_S if not timeout else min(WAKE_WAIT_S, float(timeout) / 2)


def _wake_keys(queue_keys: Sequence[str]) -> list[str]:
    return [Keys.rq_queue_wake(_text(key)) for key in queue_keys]


def _text(key: str | bytes) -> str:
    return key.decode() if isinstance(key, bytes) else key


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
        wakes = _wake_keys(queue_keys)
        block = wake_wait_s(connection)
        while True:
            found = pop_job(connection, queue_keys)
            if found is not None or deadline is None:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise DequeueTimeout(timeout, queue_keys)
            # woken by a token, or not within the block: pop again either way
            connection.blpop(wakes, timeout=min(left, block))

    @classmethod
    def lmove(cls, connection: Redis, queue_key: str, timeout: int | None) -> Any:
        # RQ's one-queue path (BLMOVE to an intermediate list) pops unstamped too.
        return cls.lpop([queue_key], timeout, connection=connection)
