"""A full Redis (``maxmemory`` reached under ``noeviction``: every write refused with
OOM) is a condition of its own, against a real server filled for the test.

What this proves:
- the API says so: ``/readyz`` is not 200 (Redis answers PING, but takes no write),
  every refused write is a 503 saying "Redis is out of memory" (not "unavailable"),
  a POST's 503 names the request id it tried, reads still answer, ``/metrics`` has
  ``vmpool_redis_writable 0`` and the memory gauges at their limit; ready again as
  soon as memory frees (well within 15 s);
- a worker and a scheduler wait it out: neither exits (0 restarts), each says so once
  and once again when it is over, and a job runs afterwards.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from rq import Queue
from rq.job import JobStatus

from vmpool.local.redis_server import RedisServer
from vmpool.state.keys import Keys
from workers.table import QUEUE_SWEEPS

from apihelp import API, make_client, spec_config
from workerhelp import start_scheduler, start_worker, wait_for, worker_env

pytestmark = pytest.mark.slow

READY_AGAIN_S = 15.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    data = tmp_path / "redis"
    data.mkdir()
    started = RedisServer(appendonly=True, directory=str(data)).start()
    try:
        yield started
    finally:
        started.stop()


def fill(conn: redis.Redis) -> None:
    """maxmemory at what Redis uses now, so that the next write is refused (OOM)."""
    conn.config_set("maxmemory-policy", "noeviction")
    conn.config_set("maxmemory", 1)
    with pytest.raises(redis.OutOfMemoryError):
        conn.set("one-more", "x")


def free(conn: redis.Redis) -> None:
    conn.config_set("maxmemory", 0)


def gauges(text: str) -> dict[str, float]:
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("vmpool_redis_")
    }


def test_the_api_says_redis_is_out_of_memory_and_recovers(server: RedisServer) -> None:
    c, _ = make_client(spec_config(), server.url)
    conn = redis.Redis.from_url(server.url)
    rid = c.post(f"{API}/ondemandvm", json={"pool3": 1}).json()["request_id"]
    assert c.get("/readyz").status_code == 200
    assert gauges(c.get("/metrics").text)["vmpool_redis_writable"] == 1
    fill(conn)
    try:
        ready = c.get("/readyz")
        assert ready.status_code == 503
        assert ready.json() == {"ok": False, "redis": "out_of_memory",
                                "message": "Redis is out of memory"}  # fmt: skip
        post = c.post(f"{API}/ondemandvm", json={"pool3": 1})
        assert post.status_code == 503
        assert post.json()["message"] == "Redis is out of memory; retry later"
        assert post.json()["redis"] == "out_of_memory" and post.json()["request_id"]
        delete = c.delete(f"{API}/ondemandvm/{rid}")
        assert (delete.status_code, delete.json()["redis"]) == (503, "out_of_memory")
        assert c.get(f"{API}/ondemandvm/{rid}").status_code == 202  # reads go on
        seen = gauges(c.get("/metrics").text)
        assert seen["vmpool_redis_up"] == 1 and seen["vmpool_redis_writable"] == 0
        assert seen["vmpool_redis_memory_max_bytes"] == 1
        assert seen["vmpool_redis_memory_used_bytes"] > 1
    finally:
        free(conn)
    freed = time.monotonic()
    wait_for(lambda: c.get("/readyz").status_code == 200, READY_AGAIN_S, "ready again")
    assert time.monotonic() - freed < READY_AGAIN_S
    assert c.post(f"{API}/ondemandvm", json={"pool3": 1}).status_code == 201
    assert gauges(c.get("/metrics").text)["vmpool_redis_memory_max_bytes"] == 0


def test_a_worker_and_a_scheduler_wait_out_a_full_redis(
    tmp_path: Path, server: RedisServer
) -> None:
    env = worker_env(tmp_path, server.url)
    worker = start_worker(tmp_path, env)
    scheduler = start_scheduler(tmp_path, env)
    conn = redis.Redis.from_url(server.url)
    sched_log = tmp_path / "scheduler.log"
    try:
        queue = Queue(Keys().queue(QUEUE_SWEEPS), connection=conn)
        first = queue.enqueue("workerhelp.slow_job", str(tmp_path), 1.5, result_ttl=60)
        wait_for(lambda: (tmp_path / "started").exists(), 30, "the job to start")
        fill(conn)  # the job's end is written into a full Redis
        wait_for(lambda: "out of memory" in worker.text(), 30, "the worker to notice")
        wait_for(lambda: "out of memory" in sched_log.read_text(), 30,
                 "the scheduler to notice")  # fmt: skip
        time.sleep(2)  # a while of it: nobody gives up
        worker.alive()
        assert scheduler.poll() is None, sched_log.read_text()
        free(conn)
        wait_for(lambda: "Redis is back" in worker.text(), 30, "the worker to go on")
        wait_for(lambda: "Redis is back" in sched_log.read_text(), 30,
                 "the scheduler to go on")  # fmt: skip
        second = queue.enqueue("workerhelp.quick_job", result_ttl=60)
        wait_for(lambda: second.get_status(refresh=True) == JobStatus.FINISHED, 30,
                 "a job after the outage")  # fmt: skip
        assert first.get_status(refresh=True) is not None
        for text in (worker.text(), sched_log.read_text()):
            assert text.count("lost Redis: Redis is out of memory") == 1, text
            assert "Traceback" not in text, text
        worker.alive()
        assert scheduler.poll() is None
    finally:
        worker.kill()
        if scheduler.poll() is None:
            os.killpg(scheduler.pid, 9)
        scheduler.wait(10)
