"""A pool whose creates fail, in plain sight and backed off (vmpool/state/pool_failures.py,
vmpool/lifecycle/failures.py), in-process against a real Redis and the simulated
provider (a template it is told does not exist fails permanently).

Red before: the pool's failure was an INFO line in a worker's log, the error counter
was never recorded, and every top-up (5 s) cloned the whole deficit again, forever."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import redis

from vmpool import lifecycle
from vmpool.config.model import ProviderConfig
from vmpool.lifecycle import Fleet
from vmpool.state.counters import ERRORS_METRIC, VMS_METRIC
from vmpool.state.keys import Keys
from vmpool.state.pool_failures import (
    BACKOFF_FIRST_S,
    BACKOFF_MAX_S,
    RECENT_KEPT,
    PoolFailures,
    latest_failures,
    read_pool_failures,
    record_failure,
)

from lifecyclehelp import SIM, clean, make_fleet, run_dispatched, warm_config

BROKEN = {"permanent_fail_templates": ["debian-12"]}


def broken_fleet(redis_client: redis.Redis, size: int = 3) -> Fleet:
    """A warm pool whose template the simulated cloud does not have."""
    config = warm_config(size)
    options = dict(config.providers[SIM].options) | BROKEN
    providers = {SIM: ProviderConfig(SIM, "simulated", options)}
    return make_fleet(redis_client, dataclasses.replace(config, providers=providers))


def failures(fleet: Fleet) -> tuple[float, PoolFailures]:
    now, got = read_pool_failures(fleet.redis, fleet.keys, ["debian"])
    return now, got["debian"]


def expire_back_off(fleet: Fleet) -> None:
    """The back-off's end, as time passing would bring it (no sleep)."""
    fleet.redis.hset(fleet.keys.pool_failures("debian"), "retry_at", "1")


def test_a_permanent_failure_is_seen_counted_and_backs_the_top_ups_off(
    redis_client: redis.Redis,
) -> None:
    """Proves: three failed creates make one streak (3 in a row, the cloud's error kept),
    count 3 under vmpooler's error counter, join the latest failures with their reason,
    and the next top-up reserves nothing while the pool backs off (the old code cloned 3
    more at every top-up)."""
    fleet = broken_fleet(redis_client)
    assert lifecycle.top_up_pools(fleet) == {"debian": 3}
    run_dispatched(fleet)
    now, f = failures(fleet)
    assert f.failing and f.consecutive == 3
    assert "template 'debian-12' not found" in f.last_error
    assert f.retry_at is not None and f.backing_off(now)
    assert f.retry_at - now <= BACKOFF_FIRST_S
    errors = redis_client.hgetall(fleet.keys.metrics(ERRORS_METRIC))
    assert errors == {"create_failed:debian": "3"}
    listed = latest_failures(redis_client, fleet.keys)
    assert [e.kind for e in listed] == ["create"] * 3
    assert all("not found" in e.reason and e.pool == "debian" for e in listed)
    assert lifecycle.top_up_pools(fleet) == {}  # backing off: nothing cloned
    clean(fleet)


def test_after_the_back_off_one_probe_and_the_delay_doubles_to_its_bound(
    redis_client: redis.Redis,
) -> None:
    """Proves the bounded exponential: each round past its back-off sends one create (a
    probe, not the pool's whole deficit), and each failed probe doubles the next delay
    (10, 20, 40 ... s), never beyond BACKOFF_MAX_S."""
    fleet = broken_fleet(redis_client, size=5)
    lifecycle.top_up_pools(fleet)
    run_dispatched(fleet)
    delays = []
    for _ in range(8):
        expire_back_off(fleet)
        assert lifecycle.top_up_pools(fleet) == {"debian": 1}  # one probe
        assert lifecycle.top_up_pools(fleet) == {}  # the probe is warming: no second one
        run_dispatched(fleet)
        _, f = failures(fleet)
        assert f.retry_at is not None and f.last_error_at is not None
        delays.append(round(f.retry_at - f.last_error_at))
    assert delays == [20, 40, 80, 160, 300, 300, 300, 300]
    assert max(delays) == BACKOFF_MAX_S
    assert failures(fleet)[1].consecutive == 5 + 8


def test_a_create_that_goes_through_ends_the_streak(redis_client: redis.Redis) -> None:
    """Proves: once the template exists, the next probe succeeds, the streak and the
    back-off end (the last error is kept, with its time), and the pool fills again."""
    broken = broken_fleet(redis_client)
    lifecycle.top_up_pools(broken)
    run_dispatched(broken)
    expire_back_off(broken)
    fixed = make_fleet(redis_client, warm_config(3), actor="worker:fixed")
    assert lifecycle.top_up_pools(fixed) == {"debian": 1}
    run_dispatched(fixed)
    now, f = failures(fixed)
    assert not f.failing and not f.backing_off(now)
    assert f.as_dict(now)["retry_at"] is None and "not found" in f.last_error
    assert lifecycle.top_up_pools(fixed) == {"debian": 2}
    run_dispatched(fixed)
    assert len(fixed.store.pool_vms("debian", "ready")) == 3
    totals = redis_client.hgetall(fixed.keys.metrics(VMS_METRIC))
    assert totals["created:debian"] == "3"
    clean(fixed)


def test_the_warning_is_logged_once_per_streak(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Proves: a streak of three failed creates logs one WARNING (what `vmpool up`
    shows), the other two at INFO."""
    fleet = broken_fleet(redis_client)
    with caplog.at_level(logging.INFO, logger="vmpool.lifecycle.failures"):
        lifecycle.top_up_pools(fleet)
        run_dispatched(fleet)
    ours = [r for r in caplog.records if r.name == "vmpool.lifecycle.failures"]
    warnings = [r for r in ours if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "pool debian: creates fail" in warnings[0].getMessage()
    assert "back off" in warnings[0].getMessage()
    assert len(ours) == 3


def test_a_round_of_failures_together_backs_off_once(redis_client: redis.Redis) -> None:
    """Proves the script's invariant: failures while the pool already backs off leave
    its retry time alone (ten creates failing at once are one round, not ten doublings)."""
    keys = Keys("t")
    first = record_failure(redis_client, keys, "create", pool="p", reason="x", permanent=True)
    assert first.started and first.retry_at is not None
    for _ in range(9):
        again = record_failure(redis_client, keys, "create", pool="p", reason="x", permanent=True)
        assert again.retry_at == first.retry_at and not again.started
    assert redis_client.hget(keys.pool_failures("p"), "rounds") == "1"
    transient = record_failure(redis_client, keys, "create", pool="q", reason="y")
    assert transient.retry_at is None and transient.consecutive == 1


def test_the_latest_failures_list_is_bounded(redis_client: redis.Redis) -> None:
    keys = Keys("t")
    for i in range(RECENT_KEPT + 20):
        record_failure(redis_client, keys, "boot", pool="p", vm=f"vm-{i}", reason="timeout")
    listed = latest_failures(redis_client, keys)
    assert len(listed) == RECENT_KEPT == redis_client.llen(keys.recent_failures)
    assert listed[0].vm == f"vm-{RECENT_KEPT + 19}"  # newest first
    assert not redis_client.exists(keys.pool_failures("p"))  # a boot is not a create


def test_a_transient_failure_does_not_hold_the_pool_back(redis_client: redis.Redis) -> None:
    """Proves: a pool whose last create failed for a transient reason is shown failing
    but still tops up its whole deficit (no back-off, no probe: the cloud's breaker
    handles a cloud that keeps failing)."""
    fleet = make_fleet(redis_client, warm_config(3))
    record_failure(redis_client, fleet.keys, "create", pool="debian", reason="HTTP 503")
    now, f = failures(fleet)
    assert f.failing and f.retry_at is None and not f.backing_off(now)
    assert lifecycle.top_up_pools(fleet) == {"debian": 3}
    run_dispatched(fleet)
    assert not failures(fleet)[1].failing  # a create went through: the streak ended
