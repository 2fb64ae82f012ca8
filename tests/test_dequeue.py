"""The worker's dequeue stamps the job it pops, so the reclaim of a duplicate is O(1).

Telling a ``queued`` job still in its queue from one popped by a dead worker with LPOS
over the queue, for every duplicate a sweep meets, costs a warm check-pending sweep of
10,000 VMs seconds of Redis time. These tests prove the decision needs no scan (no LPOS
at all, whatever the queue's length) and is still right: a job waiting anywhere in its
queue is live, a popped one is live while its beat is fresh and reclaimed once it is
stale.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from vmpool.state.keys import Keys
from workers import dequeue
from workers.dequeue import StampingQueue, pop_job
from workers.queues import HEARTBEAT_FIELD, STALE_AFTER_SECONDS, enqueue_many
from workers.table import QUEUE_SWEEPS, QUEUE_VMS, job_id

from storehelp import wait_until


def _calls(conn: redis.Redis, command: str) -> int:
    stats = conn.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def _lpos_calls(conn: redis.Redis) -> int:
    return _calls(conn, "lpos")


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


# -- the blocking wait: wake-up tokens ----------------------------------------------------
# WAKE_WAIT_S is raised to a minute in these tests: a pop that returns in seconds was
# woken by a token, not by the end of its block (the fallback for pushes without one).
LONG_WAIT_S = 60.0


class Popper:
    """An idle worker's dequeue (StampingQueue.lpop) on its own connection and thread."""

    def __init__(self, redis_url: str, queues: list[str], timeout: int = 30) -> None:
        self.conn = redis.Redis.from_url(redis_url, client_name="popper")
        self.found: list[Any] = []
        self.thread = threading.Thread(
            target=lambda: self.found.append(StampingQueue.lpop(queues, timeout, self.conn)),
            daemon=True,
        )
        self.thread.start()

    def done_within(self, seconds: float) -> bool:
        self.thread.join(seconds)
        self.conn.close()
        return not self.thread.is_alive()


def _blocked(conn: redis.Redis, count: int) -> bool:
    """Whether ``count`` poppers are blocked in their wait (CLIENT LIST flag ``b``)."""
    clients = conn.client_list()
    return sum(1 for c in clients if c["name"] == "popper" and "b" in c["flags"]) == count


@pytest.fixture
def long_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dequeue, "WAKE_WAIT_S", LONG_WAIT_S)


@pytest.mark.usefixtures("long_wait")
def test_a_push_wakes_a_blocked_worker_which_sends_nothing_while_it_waits(
    conn: redis.Redis, keys: Keys, redis_url: str
) -> None:
    """Proves: an idle worker blocks (no poll: no command while it waits) and the push's
    token wakes it at once, long before its block would end."""
    queues = [keys.rq_queue(QUEUE_SWEEPS), keys.rq_queue(QUEUE_VMS)]
    popper = Popper(redis_url, queues)
    wait_until(lambda: _blocked(conn, 1))
    conn.config_resetstat()
    time.sleep(0.5)  # the measured window of the idle wait, not a synchronisation
    assert _calls(conn, "evalsha") == 0 and _calls(conn, "blpop") == 0
    assert enqueue_many(conn, keys, "destroy_vm", ["vm-w"]) == 1
    assert popper.done_within(10.0)
    assert popper.found[0][1] == job_id(keys, "destroy_vm", "vm-w").encode()


@pytest.mark.usefixtures("long_wait")
def test_a_push_between_the_empty_pop_and_the_block_is_not_missed(
    conn: redis.Redis, keys: Keys, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: no lost wake-up. The push lands after the worker's pop found every queue
    empty and before it blocks (made so here: the pop that finds nothing is followed by
    the push); the token it left ends the block at once."""
    real_pop = dequeue.pop_job
    pushed: list[int] = []

    def pop_then_push(client: redis.Redis, queue_keys: Any) -> Any:
        found = real_pop(client, queue_keys)
        if found is None and not pushed:
            pushed.append(enqueue_many(conn, keys, "destroy_vm", ["vm-r"]))
        return found

    monkeypatch.setattr(dequeue, "pop_job", pop_then_push)
    popper = Popper(redis_url, [keys.rq_queue(QUEUE_VMS)])
    assert popper.done_within(10.0)
    assert pushed == [1]
    assert popper.found[0][1] == job_id(keys, "destroy_vm", "vm-r").encode()


@pytest.mark.usefixtures("long_wait")
def test_one_push_of_two_jobs_wakes_two_workers(
    conn: redis.Redis, keys: Keys, redis_url: str
) -> None:
    """Proves: a queue left non-empty by a pop passes a token on, so the second idle
    worker takes the second job at once instead of after its block (one push leaves
    one token)."""
    queues = [keys.rq_queue(QUEUE_VMS)]
    poppers = [Popper(redis_url, queues), Popper(redis_url, queues)]
    wait_until(lambda: _blocked(conn, 2))
    assert enqueue_many(conn, keys, "destroy_vm", ["vm-1", "vm-2"]) == 2
    assert all(p.done_within(10.0) for p in poppers)
    assert sorted(p.found[0][1] for p in poppers) == sorted(
        job_id(keys, "destroy_vm", n).encode() for n in ("vm-1", "vm-2")
    )


def test_tokens_stay_one_per_queue_and_the_empty_pop_drops_them(
    conn: redis.Redis, keys: Keys
) -> None:
    """Proves: pushes with no worker leave one token (no growth), and the pop that finds
    every queue empty drops the tokens of its queues, in the same unit."""
    queue = keys.rq_queue(QUEUE_VMS)
    wake = Keys.rq_queue_wake(queue)
    for name in ("vm-a", "vm-b", "vm-c"):
        assert enqueue_many(conn, keys, "destroy_vm", [name]) == 1
    assert conn.llen(wake) == 1
    assert pop_job(conn, [queue]) is not None
    assert conn.llen(wake) == 1  # jobs are left: the token stays for the next worker
    assert pop_job(conn, [queue]) is not None and pop_job(conn, [queue]) is not None
    assert pop_job(conn, [queue]) is None
    assert not conn.exists(wake)
