"""The worker's dequeue stamps the job it pops, so the reclaim of a duplicate is O(1).

Telling a ``queued`` job still in its queue from one popped by a dead worker with LPOS
over the queue, for every duplicate a sweep meets, costs a warm check-pending sweep of
10,000 VMs seconds of Redis time. These tests prove the decision needs no scan (no LPOS
at all, whatever the queue's length) and is still right: a job waiting anywhere in its
queue is live, a popped one is live while its beat is fresh and reclaimed once it is
stale.
"""

from __future__ import annotations

import redis

from vmpool.state.keys import Keys
from workers.dequeue import StampingQueue, pop_job
from workers.queues import HEARTBEAT_FIELD, STALE_AFTER_SECONDS, enqueue_many
from workers.table import QUEUE_SWEEPS, QUEUE_VMS, job_id


def _lpos_calls(conn: redis.Redis) -> int:
    stats = conn.info("commandstats")
    return int(stats.get("cmdstat_lpos", {}).get("calls", 0))


def test_a_waiting_job_is_live_wherever_it_is_and_no_scan_decides_it(
    conn: redis.Redis, keys: Keys
) -> None:
    """Proves: a duplicate at the back of a 2,000-long queue is refused (live), and no
    LPOS ran (the old reclaim ran one per duplicate, scanning the whole queue)."""
    names = [f"vm-{i:05d}" for i in range(2000)]
    assert enqueue_many(conn, keys, "check_pending_vm", names) == 2000
    conn.config_resetstat()
    assert enqueue_many(conn, keys, "check_pending_vm", names) == 0
    assert _lpos_calls(conn) == 0
    assert conn.llen(keys.rq_queue(QUEUE_VMS)) == 2000


def test_pop_stamps_in_priority_order_and_the_stale_popped_job_is_reclaimed(
    conn: redis.Redis, keys: Keys
) -> None:
    """Proves: the pop takes the first non-empty queue's head and stamps it in the same
    unit; a popped 'queued' job is live while fresh, reclaimed once stale."""
    assert enqueue_many(conn, keys, "destroy_vm", ["vm-a", "vm-b"]) == 2
    order = [keys.rq_queue(QUEUE_SWEEPS), keys.rq_queue(QUEUE_VMS)]
    found = pop_job(conn, order)
    assert found is not None
    queue_key, jid = found
    assert (queue_key, jid) == (order[1].encode(), job_id(keys, "destroy_vm", "vm-a").encode())
    key = keys.rq_job(jid.decode())
    beat = float(conn.hget(key, HEARTBEAT_FIELD) or 0)
    assert beat > 0 and conn.hget(key, "status") == b"queued"
    assert enqueue_many(conn, keys, "destroy_vm", ["vm-a"]) == 0  # fresh: live
    conn.hset(key, HEARTBEAT_FIELD, f"{beat - STALE_AFTER_SECONDS - 1:.3f}")
    assert enqueue_many(conn, keys, "destroy_vm", ["vm-a"]) == 1  # its popper died
    assert pop_job(conn, [keys.rq_queue(QUEUE_SWEEPS)]) is None


def test_the_queue_class_pops_without_blocking_in_burst_and_times_out(
    conn: redis.Redis, keys: Keys
) -> None:
    """Proves: RQ's lpop contract holds (None when empty without a timeout; the job
    when one is queued)."""
    queue = [keys.rq_queue(QUEUE_VMS)]
    assert StampingQueue.lpop(queue, None, connection=conn) is None
    assert enqueue_many(conn, keys, "destroy_vm", ["vm-c"]) == 1
    found = StampingQueue.lpop(queue, 1, connection=conn)
    assert found is not None and found[1] == job_id(keys, "destroy_vm", "vm-c").encode()
