"""Found by the chaos soak (seed 7, 10,000 requests): a job whose id a worker popped off
its queue (BLPOP) but never marked started, because the worker was SIGKILLed in between
or the pop's reply was lost with its connection (CLIENT KILL, a Redis restart), keeps
its hash with status ``queued`` and no TTL while it is in no queue. ``unique=True`` then
refused every later enqueue of that id, forever: in the soak, ``provision_sweep`` was
lost 2.5 minutes in, ``check_pending_sweep`` after 11, and VMs stayed ``completed``
because their ``destroy_vm`` ids were blocked. The reclaim must free such an id.

A worker pops through ``pop_job.lua``, which stamps the job's heartbeat
in the same unit, and the reclaim frees a popped ``queued`` hash once that beat is
stale (O(1), no LPOS over the queue); here the beat is aged instead of waited for.
"""

from __future__ import annotations

import redis

from vmpool.state.keys import Keys
from workers.dequeue import pop_job
from workers.queues import HEARTBEAT_FIELD, STALE_AFTER_SECONDS, enqueue, enqueue_many
from workers.table import QUEUE_SWEEPS, QUEUE_VMS, job_id


def _pop(conn: redis.Redis, keys: Keys, queue: str) -> bytes | None:
    """What a worker's dequeue does just before it is killed; then time passes: its
    stamp is older than STALE_AFTER_SECONDS (aged here rather than waited for)."""
    found = pop_job(conn, [keys.rq_queue(queue)])
    assert found is not None
    jid: bytes = found[1]
    beat = float(conn.hget(keys.rq_job(jid.decode()), HEARTBEAT_FIELD) or 0)
    assert beat > 0  # popped and stamped in one unit
    conn.hset(keys.rq_job(jid.decode()), HEARTBEAT_FIELD, f"{beat - STALE_AFTER_SECONDS - 1:.3f}")
    return jid


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
