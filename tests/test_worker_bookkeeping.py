"""RQ's per-job bookkeeping, its repeats cut (workers/bookkeeping.py).

Stock RQ writes a worker's heartbeat three or four times around every job, its state
``idle`` twice, and reads a finished job's executions twice to delete them. These tests
prove the repeats are gone while what the writes are for still holds: the worker's hash
stays fresh and its key alive, a heartbeat with an explicit TTL (a job's start, the
beats while it runs) is always written, and a finished job leaves no execution behind.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from rq import Queue
from rq.exceptions import StopRequested
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.suspension import resume, suspend
from rq.worker.base import BaseWorker

import workers.bookkeeping as bookkeeping
import workers.worker as worker_module
from vmpool.state.keys import Keys
from workers.queues import queue_names

from storehelp import wait_until


def queue(conn: redis.Redis) -> Queue:
    return Queue(queue_names(Keys())[0], connection=conn)


def count_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[tuple[Any, ...]]:
    """Record each call of ``owner.name`` (its arguments), still running it."""
    calls: list[tuple[Any, ...]] = []
    real = getattr(owner, name)

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((*args, *kwargs.values()))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return calls


def run_quick_jobs(redis_url: str, conn: redis.Redis, n: int) -> float:
    """Queue ``n`` quick jobs, run them with one burst worker, check each finished.
    The seconds the worker took."""
    jobs = [queue(conn).enqueue("workerhelp.quick_job") for _ in range(n)]
    worker = worker_module.build_worker(redis_url, None, [queue(conn).name])
    started = time.monotonic()
    assert worker.work(burst=True)
    elapsed = time.monotonic() - started
    assert [job.get_status(refresh=True) for job in jobs] == [JobStatus.FINISHED] * n
    return elapsed


def test_a_burst_of_jobs_writes_the_worker_heartbeat_about_once_a_second(
    redis_url: str, conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: 20 quick jobs write RQ's default heartbeat at most once per BEAT_EVERY_S
    (stock RQ: 3 times per job, 60+), and the state ``idle`` once per job, when it
    follows ``busy`` (stock RQ: twice per job, 40)."""
    beats = count_calls(monkeypatch, BaseWorker, "heartbeat")
    states = count_calls(monkeypatch, BaseWorker, "set_state")
    elapsed = run_quick_jobs(redis_url, conn, 20)
    bound = int(elapsed / bookkeeping.BEAT_EVERY_S) + 2  # the first, and one per period
    default_beats = [c for c in beats if not c or c[0] is None]
    assert len(default_beats) <= bound, (len(default_beats), elapsed)
    idles = [c for c in states if c[0] == "idle" and (len(c) < 2 or c[1] is None)]
    assert len(idles) <= 20 + bound, (len(idles), elapsed)


def test_an_explicit_ttl_is_always_written_and_a_default_beat_after_a_period(
    redis_url: str, conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: heartbeats with a TTL given are never skipped (each sets the key's TTL),
    a default one right after is skipped, and one a period later is written."""
    worker = worker_module.build_worker(redis_url, None, [queue(conn).name])
    worker.register_birth()
    try:
        key = worker.key
        worker.heartbeat(200)
        assert 190 < conn.ttl(key) <= 200
        worker.heartbeat(300)
        assert 290 < conn.ttl(key) <= 300  # written again at once: it names its TTL
        worker.heartbeat()  # default TTL (worker_ttl + 60 = 90 s), within the period
        assert conn.ttl(key) > 200  # skipped
        now = time.monotonic()
        monkeypatch.setattr(
            bookkeeping.time, "monotonic", lambda: now + bookkeeping.BEAT_EVERY_S + 0.01
        )
        worker.heartbeat()
        assert conn.ttl(key) <= worker.worker_ttl + 60  # written: the default TTL
    finally:
        worker.register_death()


def test_a_finished_job_reads_its_executions_once_and_leaves_none(
    redis_url: str, conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: deleting a finished job reads its execution registry once (stock RQ:
    twice), and its execution is still removed everywhere."""
    reads = count_calls(monkeypatch, bookkeeping._ReadOnce, "_read_all")
    job = queue(conn).enqueue("workerhelp.quick_job", result_ttl=0)  # as vmpool's jobs
    worker = worker_module.build_worker(redis_url, None, [queue(conn).name])
    assert worker.work(burst=True)
    assert not conn.exists(job.key)  # finished and deleted
    assert len(reads) == 1, reads
    assert not conn.keys(b"rq:execution:*") and not conn.keys(b"rq:executions:*")
    assert conn.zcard(queue(conn).started_job_registry.key) == 0


def test_a_burst_of_jobs_reads_the_suspension_flag_about_once_a_second(
    redis_url: str, conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: 20 quick jobs read RQ's suspension flag (a round trip each) at most once
    per BEAT_EVERY_S (stock RQ: at the top of every turn of the loop, 21 times)."""
    reads = count_calls(monkeypatch, BaseWorker, "check_for_suspension")
    elapsed = run_quick_jobs(redis_url, conn, 20)
    assert 1 <= len(reads) <= int(elapsed / bookkeeping.BEAT_EVERY_S) + 2, (len(reads), elapsed)


def test_a_suspension_stops_the_worker_within_a_period(
    redis_url: str, conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: the first check always reads the flag (a worker started suspended runs
    nothing), and a suspension set after a read is seen once BEAT_EVERY_S has passed."""
    job = queue(conn).enqueue("workerhelp.quick_job")
    suspend(conn)
    worker = worker_module.build_worker(redis_url, None, [queue(conn).name])
    worker.work(burst=True)  # suspended in burst mode: it quits
    assert job.get_status(refresh=True) == JobStatus.QUEUED
    resume(conn)
    worker = worker_module.build_worker(redis_url, None, [queue(conn).name])
    worker.check_for_suspension(True)  # not suspended: read, noted
    suspend(conn)
    worker.check_for_suspension(True)  # within the period: not read again
    now = time.monotonic()
    monkeypatch.setattr(
        bookkeeping.time, "monotonic", lambda: now + bookkeeping.BEAT_EVERY_S + 0.01
    )
    try:
        with pytest.raises(StopRequested):  # read again: suspended, and in burst mode
            worker.check_for_suspension(True)
    finally:
        resume(conn)


def test_a_suspension_check_skipped_before_an_idle_wait_is_made_before_it(
    redis_url: str, conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: a worker whose check at the top of a turn was skipped (a read found the
    workers not suspended less than BEAT_EVERY_S before) reads the flag before it waits
    for a job, so an idle worker parks in the suspension check. Red against the skip
    alone: a suspension set between that read and a pop was seen neither before the job
    nor after it, the worker waited for its next job as ``idle`` and would run it
    whenever it came, suspended or not (``park_in_suspension_check`` in
    tests/test_worker_lifecycle.py timed out waiting for ``suspended``)."""
    monkeypatch.setattr(bookkeeping, "BEAT_EVERY_S", 60.0)  # every skip below happens
    reads = count_calls(monkeypatch, BaseWorker, "check_for_suspension")
    worker = worker_module.build_worker(redis_url, None, [queue(conn).name])
    worker.check_for_suspension(False)  # the top of a turn: not suspended, read
    suspend(conn)  # then, before the worker's pop: a suspension and a job
    first = queue(conn).enqueue("workerhelp.quick_job", result_ttl=60)
    popped = worker.dequeue_job_and_maintain_ttl(10)
    assert popped is not None and popped[0].id == first.id
    worker.execute_job(*popped)
    worker.check_for_suspension(False)  # the next turn's top: within the period, skipped
    assert len(reads) == 1
    waited: list[Any] = []
    thread = threading.Thread(target=lambda: waited.append(worker.dequeue_job_and_maintain_ttl(10)))
    thread.start()
    try:
        wait_until(lambda: conn.hget(worker.key, "state") == b"suspended", timeout=10)
        second = queue(conn).enqueue("workerhelp.quick_job", result_ttl=60)
        assert second.get_status(refresh=True) == JobStatus.QUEUED
    finally:
        resume(conn)
        thread.join(timeout=20)
        worker.teardown()  # its job-beats thread too
    assert not thread.is_alive() and waited and waited[0] is not None
    assert waited[0][0].id == second.id  # taken once the workers were resumed


def test_deleting_a_finished_job_takes_two_round_trips(
    redis_url: str, conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: a finished job's deletion (result_ttl 0, as vmpool's jobs) sends two round
    trips: its stored status, and its execution ids read with the expired ones dropped;
    the execution the worker ran is not read back (stock RQ: four, the ids' cleanup, the
    ids and the execution's hash one by one). Nothing of the job is left."""
    sent: list[int] = []
    during: list[int] = []
    real_send = redis.Connection.send_packed_command
    real_delete = bookkeeping.LeanJob.delete

    def send(self: redis.Connection, command: Any, check_health: bool = True) -> None:
        sent.append(1)
        real_send(self, command, check_health)

    def delete(self: bookkeeping.LeanJob, *args: Any, **kwargs: Any) -> None:
        before = len(sent)
        real_delete(self, *args, **kwargs)
        during.append(len(sent) - before)

    monkeypatch.setattr(redis.Connection, "send_packed_command", send)
    monkeypatch.setattr(bookkeeping.LeanJob, "delete", delete)
    jobs = [queue(conn).enqueue("workerhelp.quick_job", result_ttl=0) for _ in range(3)]
    worker = worker_module.build_worker(redis_url, None, [queue(conn).name])
    assert worker.work(burst=True)
    assert during[1:] == [2, 2], during  # the first also connects a second client
    assert not any(conn.exists(job.key) for job in jobs)
    assert not conn.keys(b"rq:execution:*") and not conn.keys(b"rq:executions:*")
    assert not conn.smembers(f"rq:worker:{worker.name}:executions".encode())


def test_another_execution_of_the_job_is_read_and_deleted_with_it(
    redis_url: str, conn: redis.Redis
) -> None:
    """Proves: an execution of the job other than the one the worker ran (a dead
    worker's) is still read (its worker's name from its hash) and deleted everywhere."""
    job = queue(conn).enqueue("workerhelp.quick_job", result_ttl=0)
    with conn.pipeline() as pipe:
        dead = Execution.create(job, 600, pipe, worker_name="dead-worker")
        pipe.execute()
    assert conn.sismember(dead.worker_executions_key, dead.composite_key)
    worker = worker_module.build_worker(redis_url, None, [queue(conn).name])
    assert worker.work(burst=True)
    assert not conn.exists(job.key)
    assert not conn.keys(b"rq:execution:*") and not conn.keys(b"rq:executions:*")
    assert not conn.smembers(dead.worker_executions_key)
    assert conn.zcard(queue(conn).started_job_registry.key) == 0


def sent_commands(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bytes, bytes]]:
    """Every command sent to Redis from now on (a pipeline's each): name, first argument."""
    names: list[tuple[bytes, bytes]] = []
    real = redis.Connection.send_packed_command

    def send(self: redis.Connection, command: Any, check_health: bool = True) -> None:
        data = b"".join(bytes(part) for part in command) if isinstance(command, list) else command
        lines = data.split(b"\r\n")
        for i, line in enumerate(lines[:-4]):
            if line[:1] == b"*":
                names.append((lines[i + 2].upper(), lines[i + 4] if line != b"*1" else b""))
        real(self, command, check_health)

    monkeypatch.setattr(redis.Connection, "send_packed_command", send)
    return names


def test_a_vmpool_job_s_success_reads_no_dependents(
    redis_url: str, conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: the success of vmpool's own jobs (result_ttl 0, as workers/queues.py
    enqueues them) sends no WATCH or SMEMBERS of their dependents (stock RQ: one each
    per job), and still counts the job, deletes it and cleans its execution up."""
    jobs = [queue(conn).enqueue("workers.jobs.noop", result_ttl=0) for _ in range(3)]
    worker = worker_module.build_worker(redis_url, None, [queue(conn).name])
    names = sent_commands(monkeypatch)
    assert worker.work(burst=True)
    assert not [c for c in names if c[1].endswith(b":dependents")], names
    assert not any(conn.exists(job.key) for job in jobs)
    assert not conn.keys(b"rq:execution:*") and not conn.keys(b"rq:executions:*")
    assert conn.zcard(queue(conn).started_job_registry.key) == 0
    assert int(conn.hget(worker.key, "successful_job_count") or 0) == 3


def test_other_jobs_succeed_the_rq_way(
    redis_url: str, conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: a job that keeps its result, and a job not of vmpool's, go through
    RQ's own success (its dependents read, its result kept, a dependent enqueued)."""
    kept = queue(conn).enqueue("workers.jobs.noop", result_ttl=60)
    other = queue(conn).enqueue("workerhelp.quick_job", result_ttl=0)
    after = queue(conn).enqueue("workers.jobs.noop", result_ttl=60, depends_on=other)
    worker = worker_module.build_worker(redis_url, None, [queue(conn).name])
    names = sent_commands(monkeypatch)
    assert worker.work(burst=True)
    watched = {key for name, key in names if name == b"WATCH"}
    assert {kept.dependents_key.encode(), other.dependents_key.encode()} <= watched
    assert kept.get_status(refresh=True) == JobStatus.FINISHED
    assert after.get_status(refresh=True) == JobStatus.FINISHED  # its dependency's success moved it
    assert not conn.exists(other.key)


def test_a_vmpool_job_s_success_does_not_write_the_last_heartbeat_of_a_deleted_hash(
    redis_url: str, conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: a plain vmpool job's success writes no last heartbeat to its hash, which
    its success transaction deletes (stock RQ: one HSET round trip per job); a job that
    keeps its result still gets it."""
    beats = count_calls(monkeypatch, Job, "heartbeat")
    plain = [queue(conn).enqueue("workers.jobs.noop", result_ttl=0) for _ in range(3)]
    kept = queue(conn).enqueue("workers.jobs.noop", result_ttl=60)
    worker = worker_module.build_worker(redis_url, None, [queue(conn).name])
    assert worker.work(burst=True)
    assert not any(conn.exists(job.key) for job in plain)
    assert len([c for c in beats if len(c) == 2]) == 1  # each start's beat is pipelined
    assert conn.hget(kept.key, "last_heartbeat")


def test_a_failed_vmpool_job_gets_its_last_heartbeat(
    redis_url: str, conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: the last heartbeat held back at a vmpool job's end is written when the job
    failed (here: a vmpool job run by a worker without a Fleet), before its failure."""
    beats = count_calls(monkeypatch, Job, "heartbeat")
    job = queue(conn).enqueue("workers.jobs.provision_batch", result_ttl=0)
    worker = worker_module.build_worker(redis_url, None, [queue(conn).name])
    worker.work(burst=True)
    assert job.get_status(refresh=True) == JobStatus.FAILED
    assert len([c for c in beats if len(c) == 2]) == 1  # the start's beat is pipelined
    stamped = conn.hget(job.key, "last_heartbeat")
    assert stamped and stamped >= conn.hget(job.key, "started_at")
