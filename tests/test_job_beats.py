"""A worker beats its jobs from one long-lived thread, not a thread per job.

The per-job thread (started before each job and joined after it) was a fixed cost of
every job; the worker now keeps one :class:`workers.worker.JobBeats` thread that beats
whichever job runs. These tests pin down the three things that must hold: one thread
for many jobs, the running job still beaten (its hash stamped while it runs, which the
reclaim check reads), and no thread left once the worker stops.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis
from rq import Queue
from rq.job import JobStatus

import workers.worker as worker_module
from vmpool.state.keys import Keys
from workers.queues import HEARTBEAT_FIELD, queue_names

from workerhelp import wait_for


def queue(conn: redis.Redis) -> Queue:
    return Queue(queue_names(Keys())[0], connection=conn)


def beat_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "job-beats"]


def test_one_beat_thread_for_many_jobs_and_none_after_the_worker(
    redis_url: str, conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: a burst of 20 jobs starts ONE heartbeat thread (the old worker started
    20: one per job, each joined at the job's end), and the worker's teardown ends it."""
    started: list[str] = []
    real_start = threading.Thread.start

    def counting_start(self: threading.Thread) -> None:
        started.append(self.name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    jobs = [queue(conn).enqueue("workerhelp.quick_job") for _ in range(20)]
    worker = worker_module.build_worker(redis_url, None, [queue(conn).name])
    assert worker.work(burst=True)
    assert [job.get_status(refresh=True) for job in jobs] == [JobStatus.FINISHED] * 20
    beats = [name for name in started if "beat" in name]
    assert beats == ["job-beats"], started
    assert not beat_threads()  # teardown joined it


def test_the_running_job_is_still_beaten(
    tmp_path: Path, redis_url: str, conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: while a job runs, the worker's one thread stamps its hash again and
    again (beats of 0.1 s here), so the reclaim check sees it alive; between jobs it
    stamps nothing."""
    monkeypatch.setattr(worker_module, "HEARTBEAT_SECONDS", 0.1)
    worker = worker_module.build_worker(redis_url, None, [queue(conn).name])
    job = queue(conn).enqueue("workerhelp.quick_job")
    beats = worker_module.JobBeats(worker, alive=None)
    try:
        with beats.running(job):
            first = conn.hget(job.key, HEARTBEAT_FIELD)
            assert first is not None  # the beat at the start
            wait_for(lambda: conn.hget(job.key, HEARTBEAT_FIELD) != first, 5,
                     "a beat from the thread")  # fmt: skip
        conn.hdel(job.key, HEARTBEAT_FIELD)
        time.sleep(0.3)  # not a synchronisation: three beat periods with no job running
        assert conn.hget(job.key, HEARTBEAT_FIELD) is None
        assert len(beat_threads()) == 1  # the thread outlives the job, idle
    finally:
        beats.close()
    assert not beat_threads()


def test_no_beat_of_a_job_lands_after_its_running_block_returned(
    redis_url: str, conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: once ``running(job)`` has returned, no beat of that job is still to land.

    The beat thread is paused between reading the running job and stamping its hash (the
    window a loaded machine opens by itself). The block is then left from another thread.
    Without the end waiting for the beat in flight, the block returns at once, and the
    paused beat stamps the finished job's hash after the test deleted the stamp."""
    monkeypatch.setattr(worker_module, "HEARTBEAT_SECONDS", 0.05)
    in_flight, release, landed = threading.Event(), threading.Event(), threading.Event()
    real_beat = worker_module.JobBeats._beat

    def paused_beat(self: worker_module.JobBeats, now: object) -> None:
        in_flight.set()
        release.wait(10)
        real_beat(self, now)  # type: ignore[arg-type]
        landed.set()

    monkeypatch.setattr(worker_module.JobBeats, "_beat", paused_beat)
    worker = worker_module.build_worker(redis_url, None, [queue(conn).name])
    job = queue(conn).enqueue("workerhelp.quick_job")
    beats = worker_module.JobBeats(worker, alive=None)
    block = beats.running(job)
    block.__enter__()
    try:
        assert in_flight.wait(5), "the beat thread never beat"
        leaving = threading.Thread(target=block.__exit__, args=(None, None, None))
        leaving.start()
        leaving.join(0.5)
        if leaving.is_alive():  # the end waits for the beat in flight: let it land
            release.set()
        leaving.join(5)
        assert not leaving.is_alive()
        conn.hdel(job.key, HEARTBEAT_FIELD)  # the job has ended: no stamp may follow
        release.set()
        assert landed.wait(5)
        assert conn.hget(job.key, HEARTBEAT_FIELD) is None
    finally:
        release.set()
        beats.close()
