"""The schedule (workers/schedule.py) in one process, with a fake clock where time matters.

What these prove, each against a real Redis:
- late wake-ups do not add up: due times stay on a grid, so the gap between two queued
  sweeps stays within the interval however late each move comes (red against the old
  "next = move time + interval": after 10 moves each 0.9 s late, 1029 instead of <= 1020);
- a replica that read the schedule and then froze cannot, on resuming, enqueue again,
  log again or move the next due time (red against the old unconditional reschedule,
  which re-queued the sweep a worker had just run);
- no lock: a replica frozen mid-tick does not stop the other one (the old loop skipped
  every tick while a frozen replica held rq-scheduler's lock, for up to 11 s);
- a run frozen mid-way (its worker SIGSTOPped or killed) does not hold back the next run
  (red against one fixed id per job: no sweep was queued, [] instead of one);
- at most one run of a job waits in its queue at a time.
"""

from __future__ import annotations

import pickle
import re
from itertools import pairwise
from pathlib import Path

import pytest
import redis

from vmpool.config import load_config
from vmpool.state.keys import Keys
from workers import queues as q
from workers.schedule import (
    MAX_LEAD_S,
    FleetScheduler,
    cadence,
    last_run_id,
    next_due,
    read_schedule_log,
    schedule_intervals,
)
from workers.table import QUEUE_SWEEPS, job_id, template_id

from schedulehelp import Clock, queued, ran

K = Keys()
KEY = K.schedule_due
CONFIG = """\
:config: {}
:pools:
  - name: deb
    size: 0
    provider: simulated
:providers:
  :simulated: {}
"""


def _run_of(job: str, due: float) -> str:
    return job_id(K, job, run=round(due * 1000))


def _due(conn: redis.Redis, job: str = "sweep_expired") -> float:
    score = conn.zscore(KEY, template_id(K, job))
    assert score is not None
    return float(score)


def test_cadence_and_grid() -> None:
    assert cadence("sweep_expired", 2) == pytest.approx(1.5)
    assert cadence("sweep_expired", 60) == pytest.approx(60 - MAX_LEAD_S)
    assert cadence("reap_running", 2) == 2  # not a promised bound: no lead, no extra work
    assert next_due(1000, 2, 1000.9) == 1002
    assert next_due(1000, 2, 1002) == 1004  # strictly after now
    assert next_due(1000, 2, 1007.5) == 1008  # after a stall: no catch-up burst


def test_late_moves_do_not_add_up(conn: redis.Redis) -> None:
    clock = Clock(1000.0)
    s = FleetScheduler(conn, K, clock=clock)
    s.install({"sweep_expired": 2})
    moves = []
    for _ in range(10):
        clock.t = _due(conn) + 0.15  # every move 0.15 s after its due time
        assert s.enqueue_jobs() == [template_id(K, "sweep_expired")]
        moves.append(clock.t)
        ran(conn, K)
    assert _due(conn) == pytest.approx(1000.0 + 10 * cadence("sweep_expired", 2))
    gaps = [b - a for a, b in pairwise(moves)]
    assert max(gaps) <= 2  # the promise: queued at most one interval apart


def test_frozen_replica_resumes_without_effect(conn: redis.Redis) -> None:
    clock = Clock(1000.0)
    a, b = FleetScheduler(conn, K, clock=clock), FleetScheduler(conn, K, clock=clock)
    a.install({"sweep_expired": 2})
    clock.t = 1000.1
    stale = a.due_templates()  # a reads the schedule, then freezes
    assert stale == [(template_id(K, "sweep_expired"), 1000.0)]
    assert b.enqueue_jobs() == [template_id(K, "sweep_expired")]
    after_b = _due(conn)
    ran(conn, K)  # a worker runs the sweep b queued
    clock.t = 1000.5
    assert a.move(*stale[0]) is False  # a resumes
    assert queued(conn, K) == []
    assert _due(conn) == after_b
    assert [(m.job, m.due, m.replica) for m in read_schedule_log(conn, K)] == [
        ("sweep_expired", 1000.0, b.name)
    ]


def test_lost_race_after_the_check_is_refused_by_the_script(conn: redis.Redis) -> None:
    """The Lua check, not the Python pre-check, is what decides: b moves between a's
    pre-check and a's script."""
    clock = Clock(1000.0)
    a, b = FleetScheduler(conn, K, clock=clock), FleetScheduler(conn, K, clock=clock)
    a.install({"reap_running": 30})
    clock.t = 1000.2
    due = a.due_templates()[0]
    real = a._move_script

    def b_first(*args: object, **kwargs: object) -> object:
        assert b.enqueue_jobs() == [template_id(K, "reap_running")]
        return real(*args, **kwargs)

    a._move_script = b_first
    assert a.move(*due) is False
    assert [m.replica for m in read_schedule_log(conn, K)] == [b.name]
    # queued once (not bounded: its one fixed id)
    assert queued(conn, K) == [job_id(K, "reap_running")]


def test_no_lock_a_frozen_replica_does_not_stop_the_other(conn: redis.Redis) -> None:
    clock = Clock(1000.0)
    a, b = FleetScheduler(conn, K, clock=clock), FleetScheduler(conn, K, clock=clock)
    a.install({"sweep_expired": 2})
    clock.t = 1000.05
    a.due_templates()  # a is mid-tick when it freezes: it holds nothing
    assert b.tick() == [template_id(K, "sweep_expired")]


def test_two_replicas_enqueue_each_sweep_once(conn: redis.Redis, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG + ":schedule:\n  sweep: 60\n  reap: 60\n")
    intervals = schedule_intervals(load_config(path).schedule)
    a, b = FleetScheduler(conn, K), FleetScheduler(conn, K)
    a.install(intervals)
    b.install(intervals)  # idempotent: same six templates, due times kept
    assert conn.zcard(KEY) == len(intervals)
    a.enqueue_jobs()
    assert b.enqueue_jobs() == []  # nothing is due any more
    log = read_schedule_log(conn, K)
    assert sorted(m.job for m in log) == sorted(intervals)
    assert all(m.enqueued for m in log)
    assert sorted(re.sub(r"_r[0-9]+$", "", j) for j in queued(conn, K)) == sorted(
        job_id(K, job) for job in intervals
    )


def test_a_still_queued_sweep_is_not_queued_again(conn: redis.Redis) -> None:
    clock = Clock(1000.0)
    s = FleetScheduler(conn, K, clock=clock)
    s.install({"sweep_expired": 1})
    clock.t = 1000.01
    s.tick()
    clock.t = _due(conn) + 0.01  # no worker took the first one
    s.tick()
    assert queued(conn, K) == [_run_of("sweep_expired", 1000.0)]
    assert 0 < conn.ttl(K.rq_job(_run_of("sweep_expired", 1000.0))) <= q.RUN_WAIT_TTL
    assert [m.enqueued for m in read_schedule_log(conn, K)] == [True, False]
    assert last_run_id(conn, K, "sweep_expired") == _run_of("sweep_expired", 1000.0)


def test_sleep_until_the_earliest_due_time(conn: redis.Redis) -> None:
    clock = Clock(1000.0)
    s = FleetScheduler(conn, K, interval=1.0, clock=clock, seed=3)
    s.install({"sweep_expired": 2, "reap_running": 30})
    s.tick()  # both moved: sweep due at 1001.5, reap at 1030
    clock.t = 1001.2
    for _ in range(20):
        wait = s.seconds_to_next_tick()
        assert 0.3 - 1e-9 <= wait <= 0.3 + 0.05 + 1e-9
    clock.t = 1000.1  # the next due time is further than one tick away
    assert 1.0 <= s.seconds_to_next_tick() <= 1.05


def test_unknown_template_is_dropped(conn: redis.Redis) -> None:
    s = FleetScheduler(conn, K)
    conn.zadd(KEY, {"schedule-ghost": 0})
    assert s.enqueue_jobs() == []
    assert conn.zcard(KEY) == 0


def _frozen_mid_run(conn: redis.Redis, jid: str) -> None:
    """What a worker leaves when it pops a job, starts it and is then SIGSTOPped (or
    SIGKILLed): the hash says 'started', with a fresh heartbeat, and no queue holds it."""
    conn.lrem(K.rq_queue(QUEUE_SWEEPS), 0, jid)
    sec, usec = conn.time()
    conn.hset(
        K.rq_job(jid), mapping={"status": "started", q.HEARTBEAT_FIELD: f"{sec + usec / 1e6:.3f}"}
    )


def test_a_frozen_run_does_not_block_the_next(conn: redis.Redis) -> None:
    """A worker froze in the middle of a sweep. The next due time still queues a sweep
    (red before: the frozen run held the one id 'sweep', so no sweep was queued until the
    worker woke or its heartbeat went stale, and requests settled late in the soak)."""
    clock = Clock(1000.0)
    s = FleetScheduler(conn, K, clock=clock)
    s.install({"sweep_expired": 2})
    clock.t = 1000.01
    s.tick()
    [first] = queued(conn, K)
    _frozen_mid_run(conn, first)
    second_due = _due(conn)
    clock.t = second_due + 0.01
    s.tick()
    assert queued(conn, K) == [_run_of("sweep_expired", second_due)]
    assert conn.hget(K.rq_job(first), "status") == b"started"  # left alone


# -- config changes take effect --------------------------------------------------------


def test_a_shorter_interval_applies_when_a_scheduler_starts(conn: redis.Redis) -> None:
    """The interval of reap_running goes from 30 s to 2 s and a scheduler restarts: the
    next run comes within the new interval (red before: install kept the old due time
    with ZADD NX, so the job waited out the old 30 s, due at 1030 instead of <= 1007)."""
    clock = Clock(1000.0)
    old = FleetScheduler(conn, K, clock=clock)
    old.install({"reap_running": 30})
    clock.t = 1000.01
    old.tick()
    assert _due(conn, "reap_running") == pytest.approx(1030.0)
    clock.t = 1005.0
    FleetScheduler(conn, K, clock=clock).install({"reap_running": 2})
    assert _due(conn, "reap_running") == pytest.approx(1002.0)  # the last due + 2 s
    new = FleetScheduler(conn, K, clock=clock)
    assert new.enqueue_jobs() == [template_id(K, "reap_running")]  # overdue: runs now
    assert _due(conn, "reap_running") == pytest.approx(1006.0)  # then on the new grid


def test_an_unchanged_interval_keeps_its_due_time_at_restart(conn: redis.Redis) -> None:
    clock = Clock(1000.0)
    s = FleetScheduler(conn, K, clock=clock)
    s.install({"reap_running": 30})
    clock.t = 1000.01
    s.tick()
    clock.t = 1010.0
    FleetScheduler(conn, K, clock=clock).install({"reap_running": 30})
    assert _due(conn, "reap_running") == pytest.approx(1030.0)  # not pushed, not pulled


def test_a_job_of_a_newer_version_is_left_alone(
    conn: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A newer scheduler installed a template for a job this version does not know: this
    one neither runs it nor cancels it, and says so once (red before: move() cancelled
    the template, so an older replica in a rolling upgrade deleted the newer one's job)."""
    clock = Clock(1000.0)
    s = FleetScheduler(conn, K, clock=clock, interval=1.0, seed=1)
    future = "schedule-" + "future_sweep"
    template = s.create_template(
        "workers.jobs.noop",
        future,
        description="",
        meta={"vmpool_job": "future_sweep", "vmpool_interval": 3.0},
    )
    template.save()
    conn.zadd(KEY, {future: 999.0})
    with caplog.at_level("WARNING", logger="workers.schedule"):
        assert s.enqueue_jobs() == []
        assert s.enqueue_jobs() == []
    assert conn.zscore(KEY, future) == 999.0
    assert conn.exists(K.rq_job(future)) == 1
    assert queued(conn, K) == []
    assert sum("future_sweep" in r.getMessage() for r in caplog.records) == 1
    # it is not due for this replica: the sleep is a tick, not a busy loop on it
    assert s.seconds_to_next_tick() >= 1.0


def test_a_template_names_its_job_in_plain_text(conn: redis.Redis, tmp_path: Path) -> None:
    """The job's name in a template's meta (which RQ pickles) is a str, not the Job enum:
    the hash stays what it was, and a release without vmpool.ids.Job (a rolling upgrade)
    still reads it (red when install stored the Job member itself)."""
    path = tmp_path / "vmpooler.yaml"
    path.write_text(CONFIG)
    intervals = schedule_intervals(load_config(path).schedule)
    FleetScheduler(conn, K, clock=Clock(1000.0)).install(intervals)
    for job in intervals:
        meta = conn.hget(K.rq_job(template_id(K, job)), "meta")
        assert meta is not None and b"vmpool.ids" not in meta
        assert type(pickle.loads(meta)["vmpool_job"]) is str
