"""Queue turns: a worker shares its jobs between the requests and the VMs queues.

With strict priority (sweeps, then requests, then VMs) a backlog of request jobs (a
provision flood, a provision batch that keeps queueing its continuation) holds every
create of a VM back until it drains: creates waited p50 0.7-3.2 s behind provisioning.
These tests prove that a job of either queue is picked up within a bounded number of jobs
whatever the other queue's backlog, that the sweeps still go first, and that a queue that
stays empty banks no turns to starve the other later (the order's own rules).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from rq import Queue

from vmpool.config import load_config
from vmpool.state.keys import Keys
from workers import queues as q
from workers import turns
from workers.table import QUEUE_REQUESTS, QUEUE_SWEEPS, QUEUE_VMS, QUEUE_WEIGHTS
from workers.turns import QueueTurns
from workers.worker import build_worker

K = Keys()  # the default prefix, `vmpool`

CONFIG = """
:providers:
  :simulated:
    boot_seconds: 0
:pools:
  - name: deb
    template: deb
    size: 0
    provider: simulated
"""

BACKLOG = 40
# A job of one queue waits at most one full turn of the other queue's weight (plus the job
# the worker is running): the bound these tests hold the worker to.
BOUND = max(QUEUE_WEIGHTS.values()) + 1


def _request_ids(count: int) -> list[str]:
    return [f"00000000-0000-4000-8000-{i:012d}" for i in range(count)]


def _vm_names(count: int) -> list[str]:
    return [f"backlog-vm-{i:04d}" for i in range(count)]


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG)
    return path


def _queued(conn: redis.Redis, short: str) -> int:
    return len(Queue(K.queue(short), connection=conn))


def test_a_create_is_picked_up_within_a_bound_behind_a_request_backlog(
    conn: redis.Redis, redis_url: str, config_path: Path
) -> None:
    """Proves: with BACKLOG request jobs queued first, a create_vm queued after them runs
    within BOUND jobs. Red under strict priority: the worker ran request jobs only."""
    assert q.enqueue_many(conn, K, "provision_request", _request_ids(BACKLOG)) == BACKLOG
    assert q.enqueue(conn, K, "create_vm", "late-create")
    worker = build_worker(redis_url, load_config(config_path), kind="simple")
    assert worker.work(burst=True, max_jobs=BOUND)
    assert _queued(conn, QUEUE_VMS) == 0, "the create still waits behind the request backlog"
    assert _queued(conn, QUEUE_REQUESTS) >= BACKLOG - BOUND


def test_a_request_is_picked_up_within_a_bound_behind_a_vm_backlog(
    conn: redis.Redis, redis_url: str, config_path: Path
) -> None:
    """Proves: the other way round, a request job queued after BACKLOG VM jobs runs
    within BOUND jobs (so fairness did not trade one starvation for the other)."""
    assert q.enqueue_many(conn, K, "create_vm", _vm_names(BACKLOG)) == BACKLOG
    assert q.enqueue(conn, K, "provision_request", _request_ids(BACKLOG + 1)[-1])
    worker = build_worker(redis_url, load_config(config_path), kind="simple")
    assert worker.work(burst=True, max_jobs=BOUND)
    assert _queued(conn, QUEUE_REQUESTS) == 0


def test_the_sweeps_still_go_first_and_the_queues_alternate(
    conn: redis.Redis, redis_url: str, config_path: Path
) -> None:
    """Proves: a queued sweep runs before either queue's backlog, and then the two queues
    take turns by their weights (each job's queue read off the queues' lengths)."""
    assert q.enqueue_many(conn, K, "provision_request", _request_ids(BACKLOG)) == BACKLOG
    assert q.enqueue_many(conn, K, "create_vm", _vm_names(BACKLOG)) == BACKLOG
    assert q.enqueue(conn, K, "sweep_expired", run=1)
    worker = build_worker(redis_url, load_config(config_path), kind="simple")
    assert worker.work(burst=True, max_jobs=1)
    assert _queued(conn, QUEUE_SWEEPS) == 0
    assert (_queued(conn, QUEUE_REQUESTS), _queued(conn, QUEUE_VMS)) == (BACKLOG, BACKLOG)
    turn = sum(QUEUE_WEIGHTS.values())
    assert worker.work(burst=True, max_jobs=2 * turn)
    served = {short: BACKLOG - _queued(conn, short) for short in (QUEUE_REQUESTS, QUEUE_VMS)}
    assert served == {short: 2 * QUEUE_WEIGHTS[short] for short in served}


def test_an_empty_queue_banks_no_turns(
    conn: redis.Redis, redis_url: str, config_path: Path
) -> None:
    """Proves: after a run of request jobs alone (the VMs queue empty), VM jobs that
    arrive do not get a burst of saved-up turns: the request backlog still gets its
    share at once."""
    assert q.enqueue_many(conn, K, "provision_request", _request_ids(BACKLOG)) == BACKLOG
    worker = build_worker(redis_url, load_config(config_path), kind="simple")
    assert worker.work(burst=True, max_jobs=10)
    assert q.enqueue_many(conn, K, "create_vm", _vm_names(BACKLOG)) == BACKLOG
    before = _queued(conn, QUEUE_REQUESTS)
    assert worker.work(burst=True, max_jobs=BOUND)
    assert _queued(conn, QUEUE_REQUESTS) < before


def test_the_order_serves_each_queue_its_weight_and_keeps_other_queues_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Proves: with weights 2:1 the order hands the requests two pops in a row, then the
    VMs one; a queue that is no queue (the sweeps, a plain RQ queue) stays first."""
    monkeypatch.setattr(turns, "QUEUE_WEIGHTS", {QUEUE_REQUESTS: 2, QUEUE_VMS: 1})
    names = ["other", K.queue(QUEUE_SWEEPS), K.queue(QUEUE_REQUESTS), K.queue(QUEUE_VMS)]
    order = QueueTurns(names)
    heads = []
    for _ in range(6):
        first = order.order()
        assert first[:2] == names[:2]
        heads.append(first[2])
        order.served(first[2])  # both queues have jobs: the head queue is served
    assert heads == [K.queue(s) for s in ("requests", "requests", "vms") * 2]
    order.served(K.queue(QUEUE_SWEEPS))  # a sweep does not move the queues' turns
    assert order.order()[2] == K.queue(QUEUE_REQUESTS)
