"""Acknowledged means kept when the primary changes hands: planned switches and partitions,
against real servers (a primary, two replicas and three sentinels, ``valkey-server``
processes on loopback ports started here and stopped by pid: tests/sentinelhelp.py).

A writer creates and deletes requests through the store at full speed, recording every
operation the store acknowledged (tests/failoverhelp.py); after the switch and once the
group has settled, every acknowledged create must be there and every acknowledged
delete still deleted. What this proves, with vmpool's default config:

- **a planned switch** (``SENTINEL FAILOVER``, repeated): 0 acknowledged creates lost,
  0 deletes undone, served again within 20 s of each switch; none lost either by a
  writer whose creates go five to a unit of work, confirmed once at its end. A writer with
  ``durability_replicas: 1`` beside it (the knob, what the default was) loses some:
  the old primary takes writes after a replica was promoted, and the other replica,
  still following it, confirms them (``WAIT 1``);
- **a partition**: the sentinels lose the primary and one replica for 15 s while the
  writer and that replica's replication link still reach the primary: 0 lost or
  undone, served within 30 s of the heal; the ``durability_replicas: 1`` writer loses
  some;
- ``vmpool redis switchover`` loses nothing even for the ``durability_replicas: 1``
  writer, and both are served again within seconds; bad input is one line, exit 2;
- a worker and a scheduler ride out a planned switch without exiting (the scheduler's
  schedule write met NOREPLICAS in a pipeline and exited: tests/test_redis_conditions.py);
- what a write waits for follows the group: every replica the sentinels could promote
  (not one with ``replica-priority 0``); a dead replica costs writes only until the
  sentinels hold it down; the startup check names a weaker ``durability_replicas``
  and ``min-replicas-to-write 0``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vmpool.state.redis_check import check_redis

from clihelp import assert_one_line_error, run
from failoverhelp import OpWriter, options, store, verdict, wait_acknowledged, wait_served
from sentinelhelp import SentinelGroup, sentinel_group, wait_for
from workerhelp import start_scheduler, start_worker, worker_env

SWITCHES = 2
SERVED_AFTER_SWITCH_S = 20.0
PARTITION_S = 15.0
SERVED_AFTER_HEAL_S = 30.0
SERVED_AFTER_SWITCHOVER_S = 5.0


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    with sentinel_group(tmp_path, replicas=2) as started:
        yield started


@contextlib.contextmanager
def writing(*writers: OpWriter) -> Iterator[None]:
    for writer in writers:
        writer.start()
    try:
        yield
    finally:
        for writer in writers:
            writer.stop()


@pytest.mark.slow
def test_a_planned_switch_loses_no_acknowledged_write(group: SentinelGroup) -> None:
    safe = OpWriter(store(group.url), "default")
    units = OpWriter(store(group.url), "default, units of 5 creates", unit=5)
    weak = OpWriter(store(group.url, options(replicas=1)), "durability_replicas 1")
    assert safe.store.redis.durability.replicas == 2  # both replicas could be promoted
    served = []
    with writing(safe, units, weak):
        for run_number in range(SWITCHES):
            wait_acknowledged(safe, 200, 30)
            old = group.current_primary()
            switched = time.monotonic()
            group.failover()
            group.wait_failover(old)
            served.append(wait_served(safe, switched, SERVED_AFTER_SWITCH_S))
            group.wait_settled()
            if run_number == 0:
                weak.stop()  # its loss is shown once
    kept, control = verdict(group, safe), verdict(group, weak)
    assert kept.ok, kept.line()
    in_units = verdict(group, units)
    assert in_units.ok and in_units.creates >= 200, in_units.line()
    assert not control.ok, f"nothing lost with WAIT 1: {control.line()}"
    assert max(served) < SERVED_AFTER_SWITCH_S, served
    assert not safe.unexpected, safe.unexpected[:3]


@pytest.mark.slow
def test_a_partition_from_the_sentinels_loses_no_acknowledged_write(
    group: SentinelGroup,
) -> None:
    """The sentinels lose the primary and one replica (their ACL user switched off
    there); the writers, and that replica's link to the primary, do not. The sentinels
    promote the other replica; the old primary keeps taking writes, which its
    remaining replica confirms to a WAIT 1 writer, and which vanish at the heal."""
    safe = OpWriter(store(group.url), "default")
    weak = OpWriter(store(group.url, options(replicas=1)), "durability_replicas 1")
    with writing(safe, weak):
        wait_acknowledged(safe, 200, 30)
        wait_acknowledged(weak, 200, 30)
        old = group.current_primary()
        cut = [old, group.replica_nodes[0]]
        started = time.monotonic()
        group.partition(cut)
        group.wait_failover(old)
        time.sleep(max(0.0, started + PARTITION_S - time.monotonic()))  # the fault's length
        group.heal(cut)
        healed = time.monotonic()
        served = wait_served(safe, healed, SERVED_AFTER_HEAL_S)
        group.wait_settled()
    kept, control = verdict(group, safe), verdict(group, weak)
    assert kept.ok, kept.line()
    assert not control.ok, f"nothing lost with WAIT 1: {control.line()}"
    assert served < SERVED_AFTER_HEAL_S, served


@pytest.mark.slow
def test_switchover_loses_nothing_even_for_a_weaker_setting(group: SentinelGroup) -> None:
    """``vmpool redis switchover`` pauses writes, waits for every replica, fails over and
    makes the old primary a replica at once: the WAIT 1 writer loses nothing either,
    and both are served again within seconds of the command's end."""
    safe = OpWriter(store(group.url), "default")
    weak = OpWriter(store(group.url, options(replicas=1)), "durability_replicas 1")
    old = group.current_primary()
    with writing(safe, weak):
        wait_acknowledged(safe, 200, 30)
        wait_acknowledged(weak, 200, 30)
        result = run("redis", "switchover", "--json", "--redis-url", group.url)
        done = time.monotonic()
        assert result.exit_code == 0, result.output
        served = [wait_served(w, done, SERVED_AFTER_SWITCHOVER_S) for w in (safe, weak)]
        group.wait_settled()
    outcome = json.loads(result.stdout)
    assert outcome["old_primary"] == f"127.0.0.1:{old.port}"
    assert (
        outcome["new_primary"]
        == f"127.0.0.1:{group.current_primary().port}"
        != outcome["old_primary"]
    )
    for step in ("writes paused", "every replica holds offset", "SENTINEL FAILOVER", "resumed"):
        assert step in result.stderr, result.stderr
    for writer in (safe, weak):
        assert verdict(group, writer).ok, (writer.name, verdict(group, writer).line())
    assert max(served) < SERVED_AFTER_SWITCHOVER_S, served


def test_switchover_bad_input_is_one_line() -> None:
    assert_one_line_error(
        run("redis", "switchover", "--redis-url", "redis://127.0.0.1:1/0"), "through Sentinel"
    )
    assert_one_line_error(
        run("redis", "switchover", "--timeout", "0", "--redis-url", "redis://127.0.0.1:1/0"),
        "--timeout",
    )


@pytest.mark.slow
def test_a_worker_and_a_scheduler_ride_out_a_planned_switch(
    tmp_path: Path, group: SentinelGroup
) -> None:
    env = worker_env(tmp_path, group.url)
    worker = start_worker(tmp_path, env)
    scheduler = start_scheduler(tmp_path, env)
    sched_log = tmp_path / "scheduler.log"

    def jobs_done() -> int:
        return worker.text().count("Successfully completed")

    try:
        wait_for(lambda: jobs_done() > 0, 30, "a sweep the scheduler enqueued to run")
        for _ in range(SWITCHES):
            old = group.current_primary()
            group.failover()
            group.wait_failover(old)
            group.wait_settled()
        done = jobs_done()
        wait_for(lambda: jobs_done() > done + 2, 30, "sweeps to run after the switches")
        worker.alive()
        assert scheduler.poll() is None, sched_log.read_text()[-3000:]
        for text in (worker.text(), sched_log.read_text()):
            assert "Traceback" not in text, text[-3000:]
    finally:
        worker.kill()
        if scheduler.poll() is None:
            scheduler.terminate()
        scheduler.wait(10)


@pytest.mark.slow
def test_writes_wait_for_every_replica_the_sentinels_could_promote(
    group: SentinelGroup,
) -> None:
    """Two replicas: WAIT 2, no problem. ``durability_replicas: 1``: named. A replica
    with ``replica-priority 0`` (never promoted) is not waited for."""
    default = check_redis(store(group.url).redis)
    assert default.durability_text().startswith("WAIT 2: held by 2 replicas"), default
    assert "every replica the sentinels could promote" in default.durability_text()
    assert default.promotable == 2 and default.problems() == [], default.problems()
    weaker = check_redis(store(group.url, options(replicas=1)).redis)
    assert any("the sentinels could promote 2" in p for p in weaker.problems()), weaker
    with group.replica_nodes[0].client() as never_promoted:
        never_promoted.config_set("replica-priority", 0)
    client = store(group.url).redis
    wait_for(lambda: client.durability.replicas == 1, 30, "the sentinels to see priority 0")
    assert check_redis(client).problems() == []


@pytest.mark.slow
def test_min_replicas_to_write_0_is_named(group: SentinelGroup) -> None:
    with group.primary.client() as primary:
        primary.config_set("min-replicas-to-write", 0)
    check = check_redis(store(group.url).redis)
    assert any("min-replicas-to-write is 0" in p for p in check.problems()), check


@pytest.mark.slow
def test_a_dead_replica_costs_writes_until_the_sentinels_hold_it_down(
    group: SentinelGroup,
) -> None:
    """A replica killed: writes wait for it (refused, not confirmed) until a majority of
    the sentinels hold it down (down-after-milliseconds, 1 s here) and the watch has
    seen that (within a second); then they wait for the other replica alone."""
    writer = OpWriter(store(group.url), "default")
    with writing(writer):
        wait_acknowledged(writer, 50, 30)
        killed = time.monotonic()
        group.replica_nodes[0].kill()
        gap = wait_served(writer, killed + 0.2, 20)  # past the writes already in flight
    assert writer.store.redis.durability.replicas == 1
    assert gap < group.down_after_ms / 1000 + 8, gap


@pytest.mark.slow
def test_a_forked_child_watches_the_group_itself(group: SentinelGroup) -> None:
    """``vmpool worker --fork`` runs each job in a forked child. The watch's lock may be
    held by the parent's thread at the fork (held here on purpose): the child starts a
    watch of its own, with a new lock, and its writes are confirmed as the parent's."""
    client = store(group.url).redis
    assert client.durability.replicas == 2
    watch = client.source.watch  # type: ignore[union-attr]
    with watch._lock:  # a refresh under way in the parent's thread
        pid = os.fork()
        if pid == 0:  # the child: exit 0 once it refreshed and wrote
            code = 1
            try:
                watch.current()
                watch.refresh()
                client.register_script("return redis.call('SET', KEYS[1], '1')")(keys=["fork"])
                code = 0
            finally:
                os._exit(code)
    deadline = time.monotonic() + 20
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0, "the child hung or failed"


@pytest.mark.slow
def test_the_watch_asks_dead_servers_once(group: SentinelGroup) -> None:
    """The primary and a sentinel SIGKILLed: a view is made in well under a second, not
    after redis-py's default retries (10, with backoff: about 5 s a dead server). A view
    that slow was assembled from the sentinels' answers of seconds before: it named the
    old primary when it came back on its own data, and the API read from it."""
    client = store(group.url).redis
    watch = client.source.watch  # type: ignore[union-attr]
    watch.refresh()
    group.primary.kill()
    group.sentinels[2].kill()
    started = time.monotonic()
    view = watch.refresh()
    took = time.monotonic() - started
    assert view.primary == ("127.0.0.1", group.primary.port)  # not yet down for them
    assert took < 1.0, took


@pytest.mark.slow
def test_a_client_reuses_its_connections_to_the_primary(group: SentinelGroup) -> None:
    """redis-py's Sentinel pool keeps a released connection only when it leads to the
    address it discovered last; a connection opened where the watch names the primary
    must count as such, or every write opens a connection of its own (it did: writes
    ran at a quarter of their speed, most of it connecting)."""
    client = store(group.url).redis
    script = client.register_script("return redis.call('SET', KEYS[1], '1')")
    script(keys=["reuse:first"])
    with group.current_primary().client() as primary:
        before = int(primary.info("stats")["total_connections_received"])
        for i in range(20):
            script(keys=[f"reuse:{i}"])
        opened = int(primary.info("stats")["total_connections_received"]) - before
    assert opened <= 2, opened  # the watch's own may reconnect once
