"""`vmpool worker` under what Kubernetes does to it: Redis outages, SIGTERM, liveness.

Each test runs the worker as a real process (`python -m vmpool.cli.main worker`) on a
real Redis, and stops it by its pid at the end. The outage tests run their own
redis-server, stopped and started again on the same port and directory; the others use
the session's test Redis. Jobs are test-only functions of tests/workerhelp.py, which
the worker imports from its PYTHONPATH.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from rq import Queue, Worker
from rq.job import Job, JobStatus
from rq.suspension import resume, suspend

from vmpool.local.redis_server import RedisServer
from vmpool.state.keys import Keys
from workers.queues import queue_names

from workerhelp import WorkerProcess, start_worker, wait_for, worker_env

pytestmark = pytest.mark.slow

START_S = 30.0
JOB_S = 30.0
OUTAGE_S = 10.0


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    data = tmp_path / "redis"
    data.mkdir()
    server = RedisServer(appendonly=True, directory=str(data)).start()
    try:
        yield server
    finally:
        server.stop()


def restart(server: RedisServer) -> RedisServer:
    """The same port and AOF directory, as a restarted Redis pod keeps its Service."""
    return RedisServer(port=server.port, appendonly=True, directory=server.directory).start()


def queue(conn: redis.Redis) -> Queue:
    return Queue(queue_names(Keys())[0], connection=conn)


def up_and(worker: WorkerProcess, pred: Callable[[], bool]) -> Callable[[], bool]:
    """``pred``, failing at once (with the log) if the worker has exited meanwhile."""

    def check() -> bool:
        worker.alive()
        return pred()

    return check


def wait_registered(worker: WorkerProcess, conn: redis.Redis) -> Worker:
    found: list[Worker] = []

    def registered() -> bool:
        worker.alive()
        found[:] = Worker.all(connection=conn)
        return bool(found)

    wait_for(registered, START_S, "the worker to register", step=0.2)
    return found[0]


def wait_done(worker: WorkerProcess, conn: redis.Redis, job: Job) -> None:
    def done() -> bool:
        worker.alive()
        return job.get_status(refresh=True) == JobStatus.FINISHED

    wait_for(done, JOB_S, f"job {job.id} to finish", step=0.2)


def park_in_suspension_check(worker: WorkerProcess, conn: redis.Redis) -> None:
    """Suspend the workers and hand this one a job: before it (its first read of the
    flag found the suspension) or after it, the worker sits in RQ's suspension check,
    which reads Redis every second (where RQ swallows an error)."""
    rq_worker = wait_registered(worker, conn)
    suspend(conn)
    queue(conn).enqueue("workerhelp.quick_job")
    wait_for(
        up_and(worker, lambda: conn.hget(rq_worker.key, "state") == b"suspended"),
        START_S,
        "the worker to park in its suspension check",
        step=0.2,
    )


def test_a_suspension_just_after_the_worker_read_the_flag_parks_it_after_its_job(
    tmp_path: Path, redis_url: str, conn: redis.Redis
) -> None:
    """Proves: the worker parks in the suspension check after a job it popped less than
    a second after its last read of the flag (the read the next turn skips). Red before
    workers/bookkeeping.py read the skipped flag before an idle wait (5 of 5 runs): the
    job ran, the worker waited for its next job as ``idle`` and never parked, the way
    park_in_suspension_check timed out in parallel runs. The job is pushed as vmpool
    pushes (a wake-up token), so the worker pops it at once."""
    worker = start_worker(tmp_path, worker_env(tmp_path, redis_url))
    try:
        key = wait_registered(worker, conn).key
        idle = up_and(worker, lambda: conn.hget(key, "state") == b"idle")
        wait_for(idle, START_S, "the worker to wait for a job", step=0.01)  # just read
        suspend(conn)
        job = queue(conn).enqueue("workerhelp.quick_job", result_ttl=60)
        conn.lpush(Keys.rq_queue_wake(queue(conn).key), "1")
        wait_done(worker, conn, job)
        parked = up_and(worker, lambda: conn.hget(key, "state") == b"suspended")
        wait_for(parked, START_S, "the worker to park in its suspension check", step=0.1)
    finally:
        resume(conn)
        worker.kill()


def test_a_frozen_redis_during_the_suspension_check_is_waited_out(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    """Red against the old loop: RQ's work() caught the TimeoutError of its suspension
    check ("Redis connection timeout, quitting..."; a refused connection went to
    "found an unhandled exception, quitting..."), its teardown then reached Redis, and
    `vmpool worker` exited 0 (25 such exits around Redis restarts in the chaos soak).
    Here Redis freezes (SIGSTOP: a stalled host or disk) past the worker's socket
    timeout (RQ sets 25 s) and thaws once the worker has seen it."""
    server = private_redis
    assert server.process is not None
    worker = start_worker(tmp_path, worker_env(tmp_path, server.url))
    conn = redis.Redis.from_url(server.url)
    try:
        park_in_suspension_check(worker, conn)
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            wait_for(
                lambda: (
                    worker.proc.poll() is not None
                    or any(sign in worker.text() for sign in ("lost Redis", "timeout, quitting"))
                ),
                60,
                "the worker to give up on the frozen Redis",
                step=0.2,
            )
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        resume(conn)
        wait_done(worker, conn, queue(conn).enqueue("workerhelp.quick_job", result_ttl=60))
        worker.alive()
    finally:
        conn.close()
        worker.kill()


@pytest.mark.parametrize("where", ["idle", "suspension-check"])
def test_a_10s_outage_is_waited_out_then_a_job_runs(
    tmp_path: Path, private_redis: RedisServer, where: str
) -> None:
    """A worker through a 10-second outage, met waiting for a job (RQ's dequeue
    retries) or in the suspension check (RQ's loop swallowed it): it stays up, its
    alive file keeps being touched while it waits (Kubernetes must not restart it), it
    says so once, without a traceback, and takes a job once Redis is back."""
    server = private_redis
    alive = tmp_path / "alive"
    worker = start_worker(
        tmp_path, worker_env(tmp_path, server.url, VMPOOL_WORKER_ALIVE_FILE=str(alive))
    )
    conn = redis.Redis.from_url(server.url)
    try:
        if where == "idle":
            wait_registered(worker, conn)
        else:
            park_in_suspension_check(worker, conn)
        wait_for(alive.exists, START_S, "the alive file")
        server.stop()
        down_at = time.time()
        ages = []
        end = time.monotonic() + OUTAGE_S
        while time.monotonic() < end:  # the outage itself: its length is the test
            worker.alive()
            ages.append(time.time() - alive.stat().st_mtime)
            time.sleep(0.5)
        assert alive.stat().st_mtime > down_at, "the alive file went stale in the outage"
        assert max(ages) < 30, ages
        server = restart(server)
        resume(conn)
        wait_done(worker, conn, queue(conn).enqueue("workerhelp.quick_job", result_ttl=60))
        log = worker.text()
        assert log.count("lost Redis") == 1, log
        assert log.count("Redis is back") == 1, log
        assert log.count("could not connect") <= 1, log  # RQ's dequeue says it once
        assert "Traceback" not in log, log
    finally:
        conn.close()
        worker.kill()
        server.stop()


def test_a_fatal_error_in_the_loop_exits_1(tmp_path: Path, redis_url: str) -> None:
    """RQ's loop swallows any error ("found an unhandled exception, quitting") and
    returns; `vmpool worker` turns that into exit 1 and one line, so the pod restarts
    as failed instead of as a clean exit."""
    env = worker_env(tmp_path, redis_url, VMPOOL_FAILPOINTS="worker.loop=raise")
    worker = start_worker(tmp_path, env)
    try:
        assert worker.wait(START_S) == 1, worker.text()
        assert "vmpool: error: worker" in worker.text()
        assert "FailpointError" in worker.text()
    finally:
        worker.kill()


@pytest.mark.parametrize("fork", [False, True], ids=["simple", "fork"])
def test_sigterm_mid_job_finishes_it_and_exits_0(
    tmp_path: Path, redis_url: str, conn: redis.Redis, fork: bool
) -> None:
    """RQ's warm shutdown, as a scale-down or a rollout sends it: the running job (6 s)
    completes, then the worker exits 0, well within the grace period. While the job
    runs, the alive file keeps being touched (a 600 s job must not look dead)."""
    alive = tmp_path / "alive"
    marks = tmp_path / "marks"
    marks.mkdir()
    env = worker_env(tmp_path, redis_url, VMPOOL_WORKER_ALIVE_FILE=str(alive))
    worker = start_worker(tmp_path, env, *(["--fork"] if fork else []))
    try:
        wait_registered(worker, conn)
        job = queue(conn).enqueue("workerhelp.slow_job", str(marks), 6.0, result_ttl=60)
        started = marks / "started"
        wait_for(up_and(worker, started.exists), JOB_S, "the job to start")
        begun = started.stat().st_mtime
        wait_for(
            lambda: alive.stat().st_mtime > begun + 1.5,
            10,
            "the alive file to be touched while the job runs",
        )
        assert not (marks / "finished").exists()
        sent = time.monotonic()
        os.kill(worker.proc.pid, signal.SIGTERM)  # the worker only, as the kubelet does
        assert worker.wait(JOB_S) == 0, worker.text()
        assert time.monotonic() - sent < 30, "far longer than the job"
        assert (marks / "finished").exists()
        assert job.get_status(refresh=True) == JobStatus.FINISHED
        assert "warm shut down requested" in worker.text()
        assert not alive.exists(), "a stopped worker leaves no alive file behind"
    finally:
        worker.kill()


def test_a_second_sigterm_is_a_cold_shutdown(
    tmp_path: Path, redis_url: str, conn: redis.Redis
) -> None:
    """The second SIGTERM (more than a second after the first: RQ ignores a duplicate
    within one) stops the worker without waiting for its 60 s job."""
    marks = tmp_path / "marks"
    marks.mkdir()
    worker = start_worker(tmp_path, worker_env(tmp_path, redis_url))
    try:
        wait_registered(worker, conn)
        job = queue(conn).enqueue("workerhelp.slow_job", str(marks), 60.0, result_ttl=60)
        wait_for(up_and(worker, (marks / "started").exists), JOB_S, "the job to start")
        os.kill(worker.proc.pid, signal.SIGTERM)
        wait_for(
            up_and(worker, lambda: "warm shut down requested" in worker.text()),
            10,
            "the warm shutdown",
        )
        time.sleep(1.2)  # not a synchronisation: RQ ignores a second signal within 1 s
        os.kill(worker.proc.pid, signal.SIGTERM)
        assert worker.wait(15) == 0, worker.text()
        assert "cold shut down" in worker.text()
        assert not (marks / "finished").exists()
        assert job.get_status(refresh=True) != JobStatus.FINISHED
    finally:
        worker.kill()


def test_a_hung_job_stops_vouching_for_the_loop(
    tmp_path: Path, redis_url: str, conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job thread touches the alive file only within the job's timeout plus
    HUNG_AFTER_S: past that the job, and so the worker's loop, is wedged, and the
    probe must let Kubernetes restart it (scaled down here: 1 s + 0.5 s, beats of 0.1 s)."""
    import workers.worker as worker_module
    from workers.loop import AliveFile

    monkeypatch.setattr(worker_module, "HUNG_AFTER_S", 0.5)
    monkeypatch.setattr(worker_module, "HEARTBEAT_SECONDS", 0.1)
    worker = worker_module.build_worker(redis_url, None, [queue(conn).name])
    job = queue(conn).enqueue("workerhelp.quick_job", job_timeout=1)
    alive = tmp_path / "alive"
    started = time.time()
    with worker_module.one_job_beats(worker, job, None, 0.0, alive=AliveFile(alive)):
        wait_for(alive.exists, 5, "the first touch")
        wait_for(lambda: time.time() - alive.stat().st_mtime > 1.0, 10, "the touches to stop")
    assert alive.stat().st_mtime < started + 1.0 + 0.5 + 0.5


def test_sigterm_while_waiting_for_redis_exits_0_at_once(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    """A pod deleted during an outage: the worker stops waiting and exits 0 without
    waiting for Redis (nor for the grace period's SIGKILL)."""
    server = private_redis
    worker = start_worker(tmp_path, worker_env(tmp_path, server.url))
    conn = redis.Redis.from_url(server.url)
    try:
        wait_registered(worker, conn)
        server.stop()
        wait_for(
            up_and(worker, lambda: "lost Redis" in worker.text()),
            START_S,
            "the worker to wait for Redis",
        )
        os.kill(worker.proc.pid, signal.SIGTERM)
        assert worker.wait(10) == 0, worker.text()
    finally:
        conn.close()
        worker.kill()


def test_a_stop_request_outlives_a_swallowed_stop_requested(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    """Proves: a SIGTERM whose StopRequested is swallowed on its way up still stops the
    wait for Redis.

    RQ's handler raises StopRequested wherever the main thread is. If that is inside a
    logging handler's emit (logging catches Exception), the exception is gone. Without a
    flag that outlives it, a worker waiting for Redis would wait on until SIGKILL. Here
    the handler runs inside such a catch-all, then the wait must end at its next tick."""
    import contextlib
    import threading

    from rq.exceptions import StopRequested

    from workers.loop import wait_for_redis
    from workers.worker import build_worker

    worker = build_worker(private_redis.url, None, [queue_names(Keys())[0]])
    private_redis.stop()
    with contextlib.suppress(Exception):  # what logging.Handler.emit does with it
        worker.request_stop(signal.SIGTERM, None)
    assert worker.redis_check is not None
    outcome: list[str] = []

    def wait() -> None:
        try:
            wait_for_redis(worker.redis_check, tick=worker.wait_tick)  # type: ignore[arg-type]
            outcome.append("redis back")
        except StopRequested:
            outcome.append("stopped")

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(10)
    assert outcome == ["stopped"]


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "mid-job"])
def test_sigterm_stops_the_worker_within_5_s(
    tmp_path: Path, redis_url: str, conn: redis.Redis, busy: bool
) -> None:
    """Proves, with the locked redis-py: `vmpool worker` exits 0 within 5 s of SIGTERM,
    idle (waiting for a job) and in the middle of a 1 s job (finished first: RQ's warm
    shutdown). RQ's teardown stops the thread that listens for commands to the worker,
    and redis-py 8.2's stop() waits for it: with RQ's 60 s wait in that thread, the
    worker took a minute to exit in some runs (see the next test for the race, made
    deterministic)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    worker = start_worker(tmp_path, worker_env(tmp_path, redis_url))
    try:
        wait_registered(worker, conn)
        if busy:
            queue(conn).enqueue("workerhelp.slow_job", str(marks), 1.0, result_ttl=60)
            wait_for(up_and(worker, (marks / "started").exists), JOB_S, "the job to start")
        sent = time.monotonic()
        os.kill(worker.proc.pid, signal.SIGTERM)
        assert worker.wait(JOB_S) == 0, worker.text()
        took = time.monotonic() - sent
        assert took < 5.0, f"exited {took:.1f} s after SIGTERM:\n{worker.text()[-2000:]}"
        assert (marks / "finished").exists() == busy
    finally:
        worker.kill()


def _stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP): its state in /proc is T."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


def test_sigterm_while_the_worker_starts_stops_it_cleanly(
    tmp_path: Path, redis_url: str, conn: redis.Redis
) -> None:
    """Proves: a SIGTERM that arrives while the worker starts (registered, before RQ
    installs its signal handlers at the end of its start) ends it with exit 0 and its
    registration removed, where the default action killed it (-15) and left the
    registration behind. The worker stops itself (SIGSTOP) at the failpoint inside its
    start; the SIGTERM sent then waits, unless its action is the default, which kills a
    stopped process at once; SIGCONT lets it go on."""
    env = worker_env(tmp_path, redis_url, VMPOOL_FAILPOINTS="worker.start=stop")
    worker = start_worker(tmp_path, env)
    try:
        wait_for(lambda: _stopped(worker.proc.pid), START_S, "the worker to stop in its start")
        assert Worker.all(connection=conn), "registered before the failpoint"
        os.kill(worker.proc.pid, signal.SIGTERM)
        os.kill(worker.proc.pid, signal.SIGCONT)
        assert worker.wait(JOB_S) == 0, worker.text()
        assert Worker.all(connection=conn) == []
    finally:
        worker.kill()


def test_the_command_thread_notices_a_stop_within_its_wait(redis_url: str) -> None:
    """Proves: the thread that listens for commands to the worker ends within
    PUBSUB_WAIT_S (and 3 s) of being stopped while it waits with nothing to read, the state that
    made a worker's exit hang for 60 s. RQ's teardown sends UNSUBSCRIBE, then stops the
    thread: when the thread has read the reply first, it waits again, RQ's 60 s, and
    redis-py 8.2's stop() waits for it. Here the thread is put in that state on purpose:
    a command is published, its handler seen done, and the thread seen back in its wait
    (its stack), before it is stopped. Red with RQ's wait of 60 s (with either redis-py:
    the stop is made from another thread, and the thread is timed, not the stop call)."""
    import sys
    import threading

    from workers.loop import PUBSUB_WAIT_S
    from workers.worker import build_worker

    worker = build_worker(redis_url, None, [queue_names(Keys())[0]])
    handled = threading.Event()

    def command_handled(message: object) -> None:
        handled.set()

    worker.handle_payload = command_handled  # type: ignore[method-assign]
    worker.subscribe()
    thread = worker.pubsub_thread
    assert thread is not None
    publisher = redis.Redis.from_url(redis_url)
    try:

        def waiting_again() -> bool:
            frame = sys._current_frames().get(thread.ident or 0)
            names = []
            while frame is not None:
                names.append(frame.f_code.co_name)
                frame = frame.f_back
            return "can_read" in names and "command_handled" not in names

        wait_for(
            lambda: handled.is_set() or bool(publisher.publish(worker.pubsub_channel_name, "{}")),
            START_S,
            "the command thread to handle a command",
        )
        wait_for(lambda: handled.is_set(), START_S, "the handler")
        wait_for(waiting_again, START_S, "the command thread back in its wait", step=0.01)
        stopped = time.monotonic()
        threading.Thread(target=thread.stop, daemon=True).start()
        thread.join(3.0)  # seconds, not RQ's minute
        assert not thread.is_alive(), "the command thread still waits 3 s after its stop"
        assert time.monotonic() - stopped < PUBSUB_WAIT_S + 1.0
    finally:
        publisher.close()
        worker.connection.close()
