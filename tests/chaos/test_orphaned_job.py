"""Found by the chaos soak (seed 7, 10,000 requests): a job whose id a worker popped off
its queue (BLPOP) but never marked started, because the worker was SIGKILLed in between
or the pop's reply was lost with its connection (CLIENT KILL, a Redis restart), keeps
its hash with status ``queued`` and no TTL while it is in no queue. ``unique=True`` then
refused every later enqueue of that id, forever: in the soak, ``provision_sweep`` was
lost 2.5 minutes in, ``check_pending_sweep`` after 11, and VMs stayed ``completed``
because their ``destroy_vm`` ids were blocked. The reclaim must free such an id.
"""

from __future__ import annotations

import redis

from vmpool.state.keys import Keys
from workers.queues import enqueue, enqueue_many
from workers.table import QUEUE_SWEEPS, QUEUE_VMS, job_id


def _pop(conn: redis.Redis, keys: Keys, queue: str) -> bytes | None:
    """What a worker's BLPOP does just before it is killed."""
    return conn.lpop(keys.rq_queue(queue))  # type: ignore[return-value]


def test_a_sweep_popped_by_a_dead_worker_can_be_enqueued_again(
    conn: redis.Redis, keys: Keys
) -> None:
    jid = job_id(keys, "provision_sweep").encode()
    assert jid == b"vmpool-provision_sweep"
    assert enqueue(conn, keys, "provision_sweep")
    assert not enqueue(conn, keys, "provision_sweep")  # a live queued copy: a duplicate
    assert _pop(conn, keys, QUEUE_SWEEPS) == jid
    assert conn.exists(keys.rq_job(jid.decode()))  # the orphan: queued, in no queue
    assert enqueue(conn, keys, "provision_sweep")  # the orphan is reclaimed
    assert conn.lrange(keys.rq_queue(QUEUE_SWEEPS), 0, -1) == [jid]


def test_enqueue_many_reclaims_popped_orphans_and_keeps_live_duplicates(
    conn: redis.Redis, keys: Keys
) -> None:
    names = ["odd-art-aaaaa", "odd-art-bbbbb"]
    ids = [job_id(keys, "destroy_vm", name).encode() for name in names]
    assert ids == [b"vmpool-destroy_vm-odd-art-aaaaa", b"vmpool-destroy_vm-odd-art-bbbbb"]
    assert enqueue_many(conn, keys, "destroy_vm", names) == 2
    assert _pop(conn, keys, QUEUE_VMS) == ids[0]
    # the orphan is queued again; the one still in its queue is a live duplicate
    assert enqueue_many(conn, keys, "destroy_vm", names) == 1
    assert sorted(conn.lrange(keys.rq_queue(QUEUE_VMS), 0, -1)) == ids
