"""Idle periodic jobs skipped, the pending sweep parked and woken (workers/schedule_park.py).

What these prove, each against a real Redis (a fake clock for the schedulers, the real
store's scripts for the reservations):
- a job whose inputs are all absent is not run, and its due times go on on their grid,
  so it runs at the first due time after an input appears;
- the pending sweep parks when nothing is reserved or booting (its next due time is the
  safety tick, and it still runs), and the store's reservation of a VM wakes it: a
  replica's wait ends at once, the due time goes to a cadence after the last move, and
  the sweep runs at its interval while a VM is reserved;
- a wait whose blocking pop has its connection killed (the soak's ``client_kill``) still
  ends at its due time. Red against redis-py's retry of the pop: sent again with its
  whole timeout, a 1 s wait cut at 0.5 s lasted about 1.5 s, and with both replicas
  blocked a due expiry sweep was queued 0.8 s late (the plain soak's settle bound);
- a reservation made while a replica moves the sweep (after it read the due time, before
  its script, with another replica taking wake-ups meanwhile) is not missed. Red
  against the check made before the move's script (a separate unit): the mark that
  check set is taken by the reservation, the other replica's wake-up finds the sweep
  not parked yet, and the move then parks it for PARK_S with a VM reserved.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis

from vmpool.config import Config, default_redis_options, load_config
from vmpool.lifecycle.idle import sweep_inputs
from vmpool.state.connection import connect
from vmpool.state.keys import Keys
from vmpool.state.store import Store
from workers.schedule import PARK_S, FleetScheduler, MoveOutcome, read_schedule_log
from workers.schedule_park import Parking
from workers.table import job_id, template_id

from schedulehelp import Clock, queued, ran
from storehelp import make_request, poll

K = Keys()
PENDING = "check_pending_sweep"
CONFIG = """\
:pools:
  - {name: debian, alias: [deb], template: debian-12, size: 0, provider: simulated}
:providers:
  :simulated: {}
"""


@pytest.fixture
def config(tmp_path: Path) -> Config:
    path = tmp_path / "vmpool.yaml"
    path.write_text(CONFIG)
    return load_config(path)


def _due(conn: redis.Redis, job: str = PENDING) -> float:
    score = conn.zscore(K.schedule_due, template_id(K, job))
    assert score is not None
    return float(score)


def _reserve(redis_client: redis.Redis, rid: str) -> None:
    """A request of one VM, reserved (not yet created) through the store's scripts."""
    make_request(Store(redis_client, K), rid, 1, created=False)


def test_an_idle_job_is_not_run_and_its_grid_goes_on(conn: redis.Redis, config: Config) -> None:
    clock = Clock(1000.0)
    s = FleetScheduler(conn, K, clock=clock, inputs=sweep_inputs(config, K))
    s.install({"destroy_sweep": 5})
    clock.t = 1000.1
    assert s.tick() == [template_id(K, "destroy_sweep")]
    assert queued(conn, K) == []
    assert _due(conn, "destroy_sweep") == pytest.approx(1005.0)
    conn.zadd(K.pool_state("debian", "completed"), {"vm-done": 1.0})  # a VM to destroy
    clock.t = 1005.1
    s.tick()
    assert queued(conn, K) == [job_id(K, "destroy_sweep")]
    log = read_schedule_log(conn, K)
    assert [(m.outcome, m.next_due) for m in log] == [
        (MoveOutcome.IDLE, 1005.0),
        (MoveOutcome.QUEUED, 1010.0),
    ]


def test_the_pending_sweep_parks_and_a_reservation_wakes_it(
    conn: redis.Redis, redis_client: redis.Redis, config: Config
) -> None:
    clock = Clock(1000.0)
    s = FleetScheduler(conn, K, clock=clock, inputs=sweep_inputs(config, K))
    s.install({PENDING: 0.25})
    clock.t = 1000.01
    s.tick()  # nothing reserved or booting: it runs, and parks
    assert queued(conn, K) == [job_id(K, PENDING)]
    assert _due(conn) == pytest.approx(1000.01 + PARK_S)
    assert float(conn.get(K.schedule_parked) or 0) == pytest.approx(1000.25)
    ran(conn, K)
    _reserve(redis_client, "r-1")  # the store's script takes the mark, wakes the schedule
    assert not conn.exists(K.schedule_parked)
    started = time.monotonic()
    s.parking.wait(PARK_S)
    assert time.monotonic() - started < 5.0, "the wait did not end on the wake-up"
    assert _due(conn) == pytest.approx(1000.25)  # a cadence after the parking move
    clock.t = 1000.26
    s.tick()  # a VM is reserved: at its interval again, on the grid
    assert queued(conn, K) == [job_id(K, PENDING)]
    assert _due(conn) == pytest.approx(1000.5)
    assert not conn.exists(K.schedule_parked)
    _reserve(redis_client, "r-2")  # not parked: no wake-up
    assert not conn.exists(K.schedule_wake)


def test_a_reservation_during_a_move_is_not_missed(
    conn: redis.Redis, redis_client: redis.Redis, config: Config
) -> None:
    clock = Clock(1000.0)
    inputs = sweep_inputs(config, K)
    a = FleetScheduler(conn, K, clock=clock, inputs=inputs)
    b = FleetScheduler(conn, K, clock=clock, inputs=inputs)
    a.install({PENDING: 0.25})
    clock.t = 1000.01
    (due,) = a.due_templates()
    real = a._move_script

    def reserve_first(*args: object, **kwargs: object) -> object:
        _reserve(redis_client, "r-1")
        b.parking.wait(0.2)  # b takes any wake-up the reservation pushed
        return real(*args, **kwargs)

    a._move_script = reserve_first  # type: ignore[method-assign]
    a.move(*due)
    assert _due(conn) <= 1000.25 + 1e-9, "parked with a VM reserved"
    assert not conn.exists(K.schedule_parked)


def test_a_wait_too_short_to_block_still_takes_the_wake_up(
    conn: redis.Redis, redis_client: redis.Redis, config: Config
) -> None:
    """A replica whose waits are all shorter than a block (``vmpool scheduler --interval
    0.2``, or another job due within 0.2 s) still takes a wake-up: the parked sweep's due
    time moves at the next wait. Red against waits that only block: the wake-up stayed in
    its list and the sweep ran at its safety tick, PARK_S later."""
    clock = Clock(1000.0)
    s = FleetScheduler(conn, K, clock=clock, inputs=sweep_inputs(config, K))
    s.install({PENDING: 0.25})
    clock.t = 1000.01
    s.tick()  # parks
    assert _due(conn) == pytest.approx(1000.01 + PARK_S)
    _reserve(redis_client, "r-1")
    s.parking.wait(0.1)
    assert not conn.exists(K.schedule_wake)
    assert _due(conn) == pytest.approx(1000.25)


def _kill_blocked_pop(admin: redis.Redis, at: float, killed: threading.Event) -> None:
    """At ``at`` (monotonic), kill the connection blocked in BLPOP, once it is."""
    blocked: list[dict[str, str]] = []

    def found() -> bool:
        blocked[:] = [c for c in admin.client_list() if c["cmd"] == "blpop"]
        return bool(blocked)

    if poll(found, 5, 0.01):
        time.sleep(max(0.0, at - time.monotonic()))  # the fault's moment, not a sync
        admin.client_kill_filter(_id=blocked[0]["id"])
        killed.set()


def test_a_wait_whose_connection_is_killed_still_ends_at_its_due_time(
    redis_url: str, redis_client: redis.Redis, config: Config
) -> None:
    """The replica's client as vmpool makes it (one retry on a dead connection): its
    block killed halfway, the wait still ends within a block's lateness of its end."""
    client = connect(redis_url, default_redis_options(), decode_responses=False)
    parking = Parking(client, K, sweep_inputs(config, K))
    killed = threading.Event()
    start = time.monotonic()
    killer = threading.Thread(target=_kill_blocked_pop, args=(redis_client, start + 0.5, killed))
    killer.start()
    try:
        parking.wait(1.0)
        took = time.monotonic() - start
    finally:
        killer.join(10)
        client.close()
    assert killed.is_set()
    assert took < 1.0 + 0.2, took
