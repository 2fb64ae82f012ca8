"""Found by the chaos soak (seed 7, 10,000 requests): a job whose id a worker popped off
its queue (BLPOP) but never marked started, because the worker was SIGKILLed in between
or the pop's reply was lost with its connection (CLIENT KILL, a Redis restart), keeps
its hash with status ``queued`` and no TTL while it is in no queue. ``unique=True`` then
refused every later enqueue of that id, forever: in the soak, ``provision-sweep`` was
lost 2.5 minutes in, ``check-pending-sweep`` after 11, and VMs stayed ``completed``
because their ``destroy-<name>`` ids were blocked. The reclaim must free such an id.
"""

from __future__ import annotations

import redis
from rq import Queue

from workers.queues import QUEUE_SWEEPS, QUEUE_VMS, enqueue, enqueue_many


def _pop(conn: redis.Redis, queue: str) -> bytes | None:
    """What a worker's BLPOP does just before it is killed."""
    return conn.lpop(Queue(queue, connection=conn).key)  # type: ignore[return-value]


def test_a_sweep_popped_by_a_dead_worker_can_be_enqueued_again(
    redis_url: str, redis_client: redis.Redis
) -> None:
    conn = redis.Redis.from_url(redis_url)
    try:
        assert enqueue(conn, "provision-sweep")
        assert not enqueue(conn, "provision-sweep")  # a live queued copy: a duplicate
        assert _pop(conn, QUEUE_SWEEPS) == b"provision-sweep"
        assert enqueue(conn, "provision-sweep")  # the orphan is reclaimed
        assert conn.lrange(Queue(QUEUE_SWEEPS, connection=conn).key, 0, -1) == [
            b"provision-sweep"
        ]
    finally:
        conn.close()


def test_enqueue_many_reclaims_popped_orphans_and_keeps_live_duplicates(
    redis_url: str, redis_client: redis.Redis
) -> None:
    conn = redis.Redis.from_url(redis_url)
    try:
        assert enqueue_many(conn, "destroy", ["odd-art-aaaaa", "odd-art-bbbbb"]) == 2
        assert _pop(conn, QUEUE_VMS) == b"destroy-odd-art-aaaaa"
        # the orphan is queued again; the one still in its queue is a live duplicate
        assert enqueue_many(conn, "destroy", ["odd-art-aaaaa", "odd-art-bbbbb"]) == 1
        key = Queue(QUEUE_VMS, connection=conn).key
        assert sorted(conn.lrange(key, 0, -1)) == [
            b"destroy-odd-art-aaaaa",
            b"destroy-odd-art-bbbbb",
        ]
    finally:
        conn.close()
