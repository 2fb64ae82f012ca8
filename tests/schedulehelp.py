"""Helpers shared by the schedule tests: a settable clock, the sweeps queue as workers see it."""

from __future__ import annotations

import redis
from rq import Queue

from vmpool.state.keys import Keys
from workers.table import QUEUE_SWEEPS


class Clock:
    """A settable clock standing in for Redis server time."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def queued(conn: redis.Redis, keys: Keys) -> list[str]:
    """The ids waiting in the sweeps queue."""
    return list(Queue(keys.queue(QUEUE_SWEEPS), connection=conn).job_ids)


def ran(conn: redis.Redis, keys: Keys) -> None:
    """What the workers do with the queued sweeps: pop, run, delete their hashes."""
    for jid in queued(conn, keys):
        conn.lrem(keys.rq_queue(QUEUE_SWEEPS), 0, jid)
        conn.delete(keys.rq_job(jid))
