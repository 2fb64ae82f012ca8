"""The fleet id is generated once per Redis, kept there, and the same for every caller."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from fastapi.testclient import TestClient

from vmpool import lifecycle
from vmpool.cli.main import cli
from vmpool.config import default_redis_options, load_config
from vmpool.ids import Job
from vmpool.lifecycle import Fleet, RecordingDispatcher
from vmpool.providers import SimulatedProvider
from vmpool.state.connection import connect
from vmpool.state.durability import DurabilitySetting, WriteNotConfirmed
from vmpool.state.fleet_identity import (
    FleetMarks,
    IdentityWatch,
    MarkRole,
    fleet_identity,
    read_marks,
    settle_identity,
)
from vmpool.state.keys import Keys
from vmpool.state.records import Slot
from vmpool.state.store import Store

from apihelp import make_app
from lifecyclehelp import SIM, create_request, make_fleet, run_dispatched
from processhelp import Output
from storehelp import make_request, wait_until


def test_generated_once_and_kept(redis_client: redis.Redis) -> None:
    keys = Keys()
    first = fleet_identity(redis_client, keys)
    assert re.fullmatch(r"vmpool-[0-9a-f]{12}", first)
    assert fleet_identity(redis_client, keys) == first
    assert redis_client.get(keys.fleet_identity()) in (first, first.encode())


def test_another_redis_database_gets_another(redis_url: str, redis_client: redis.Redis) -> None:
    """Two installs (here: two prefixes in one database) never share an id by default."""
    assert fleet_identity(redis_client, Keys("a")) != fleet_identity(redis_client, Keys("b"))


def test_processes_starting_together_agree(redis_client: redis.Redis) -> None:
    keys = Keys()
    barrier = threading.Barrier(8)
    seen: list[str] = []

    def start() -> None:
        barrier.wait()
        seen.append(fleet_identity(redis_client, keys))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(seen) == 8 and len(set(seen)) == 1


def test_an_upgraded_redis_gets_an_identity_of_its_own(redis_client: redis.Redis) -> None:
    """VM records and no identity (or the prefix as identity): an older version made them
    and marked them with the key prefix. The identity is a new one of this Redis's own,
    never the prefix every such install shares; the prefix is kept as a legacy mark,
    listed but owning nothing (only the records say which of its VMs are this fleet's)."""
    keys = Keys()
    make_request(Store(redis_client, keys), "11111111-1111-4111-8111-111111111111", n=1)
    identity = fleet_identity(redis_client, keys)
    assert re.fullmatch(r"vmpool-[0-9a-f]{12}", identity)
    marks = read_marks(redis_client, keys)
    assert marks == FleetMarks(identity, {"vmpool": MarkRole.LEGACY})
    assert marks.listed(identity) == (identity, "vmpool") and not marks.owns("vmpool", identity)
    assert marks.problem() is None  # an upgrade is not a loss

    redis_client.flushdb()
    redis_client.set(keys.fleet_identity(), keys.prefix)  # the former upgrade rule's
    assert fleet_identity(redis_client, keys) not in (keys.prefix, identity)
    assert read_marks(redis_client, keys).others == {"vmpool": MarkRole.LEGACY}  # type: ignore[union-attr]


def test_a_new_fleet_settles_its_identity_before_its_first_vm(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    """A new fleet's identity is its own, never the prefix, whether it is made before
    or after the fleet's first VM record."""
    path = tmp_path / "vmpool.yaml"
    path.write_text(
        ":providers:\n  :aws: {provider_class: ec2, region: us-east-1}\n"
        ":pools:\n  - {name: debian, provider: aws, template: ami-1}\n"
    )
    config = load_config(path)
    fleet = Fleet.build(redis_client, config, RecordingDispatcher(), "worker:test:1")
    make_request(fleet.store, "22222222-2222-4222-8222-222222222222", n=1)
    identity = fleet_identity(redis_client, fleet.keys)
    assert identity != fleet.keys.prefix and identity.startswith("vmpool-")


def lose_fleet_data(client: redis.Redis, keys: Keys) -> None:
    """Redis loses the fleet's data; the cloud keeps its VMs.

    Every key of the fleet goes but the simulated cloud's: its VMs stand for a real
    cloud's, which a lost Redis leaves running."""
    cloud = f"{keys.prefix}:sim:"
    for key in list(client.scan_iter(match=f"{keys.prefix}:*", count=1000)):
        if not str(key).startswith(cloud):
            client.delete(key)


SIM_CONFIG = """
:providers:
  :sim: {provider_class: simulated, boot_seconds: 0, seed: 1}
:config: {reconcile_grace: 0, ondemand_request_ttl: 10, timeout: 1}
:pools:
  - {name: debian, alias: [deb], template: debian-12, size: 0, provider: sim}
"""


def test_a_running_fleet_that_lost_its_redis_data_destroys_nothing(
    redis_client: redis.Redis, redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis loses the fleet's data while a worker runs and its VMs run in the
    (simulated) cloud. The running worker's reconcile, with no grace and several times,
    destroys none of them: none has a record any more, and the fleet does not know
    whether a user still holds one. The worker records its identity as a lost mark (an
    error in its log), a process started afterwards warns of it, ``vmpool audit`` names
    it (exit 1), /metrics counts it; the operator's ``--adopt`` ends the hold, and the
    VMs no record holds are then destroyed. On the naive code the first reconcile
    destroyed them all as leaks."""
    path = tmp_path / "vmpool.yaml"
    path.write_text(SIM_CONFIG)
    config = load_config(path)
    fleet = make_fleet(redis_client, config)
    held = fleet_identity(redis_client, fleet.keys)
    create_request(fleet.store, "r1", [Slot("deb", "debian", 2)], config)
    fleet.dispatch.send(Job.PROVISION_REQUEST, ["r1"])
    run_dispatched(fleet)
    sim = fleet.providers[SIM]
    assert isinstance(sim, SimulatedProvider) and sim.count() == 2
    record = fleet.store.get_request("r1")
    assert record is not None and record.status == "ready"

    lose_fleet_data(redis_client, fleet.keys)
    with caplog.at_level(logging.ERROR, logger="vmpool.state.fleet_identity"):
        for _ in range(3):
            counts = lifecycle.reconcile(fleet)
            assert counts == {"unrecorded_kept": 2}, counts
            run_dispatched(fleet)
    assert sim.count() == 2
    assert [r.levelname for r in caplog.records].count("ERROR") == 1  # said once
    assert f"fleet identity {held} is no longer Redis's" in caplog.text
    marks = read_marks(redis_client, fleet.keys)
    assert marks is not None and marks.lost == (held,) and marks.identity != held

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vmpool.state.fleet_identity"):
        make_fleet(redis_client, config, actor="worker:test:2")
    assert f"the VMs marked vmpool-fleet={held} are neither adopted nor destroyed" in caplog.text
    where = ["--config", str(path), "--redis-url", redis_url]
    audit = CliRunner().invoke(cli, ["audit", *where])
    assert audit.exit_code == 1 and "fleet identity: Redis lost the fleet's data" in audit.stdout
    report = json.loads(CliRunner().invoke(cli, ["audit", "--json", *where]).stdout)
    assert report["fleet"]["marks"] == {held: "lost"} and report["fleet"]["problem"]
    with TestClient(make_app(config, redis_url)) as client:
        metrics = client.get("/metrics").text
    assert 'vmpool_fleet_marks{role="lost"} 1.0' in metrics

    adopted = CliRunner().invoke(cli, ["fleet-id", "--adopt", held, *where])
    assert adopted.exit_code == 0, adopted.output
    assert lifecycle.reconcile(fleet) == {"leaked_destroyed": 2}
    assert sim.count() == 0


def test_the_identity_is_written_only_once_confirmed(redis_url: str) -> None:
    """The identity's write goes through the durability confirmation: a client that
    waits for a replica the Redis does not have is told the write is not confirmed
    (and kept from using an identity a failover could take back). On the naive code a
    plain SET NX was acknowledged at once."""
    setting = DurabilitySetting(mode="replicas", replicas=1, timeout_s=0.2)
    options = dataclasses.replace(default_redis_options(), durability=setting)
    client = connect(redis_url, options, decode_responses=True)
    try:
        client.flushdb()
        with pytest.raises(WriteNotConfirmed):
            fleet_identity(client, Keys())
    finally:
        client.close()


@pytest.mark.slow
def test_every_process_names_a_lost_mark_at_start(
    redis_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """A Redis that holds a lost mark: `vmpool up` says so on its screen before anything
    starts, and the API, the worker and the scheduler it starts each say so in their
    logs (a real `vmpool up`, stopped by SIGINT)."""
    keys = Keys()
    settle_identity(redis_client, keys, held="vmpool-0000aaaabbbb")  # a process noticed
    path = tmp_path / "vmpool.yaml"
    path.write_text(SIM_CONFIG)
    logs = tmp_path / "run"
    command = ["up", "--workers", "1", "--port", "0", "--log-dir", str(logs)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "vmpool.cli.main", *command, "--config", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "VMPOOL_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    out = Output(proc.stdout)
    words = "the VMs marked vmpool-fleet=vmpool-0000aaaabbbb are neither adopted nor destroyed"
    try:
        wait_until(lambda: "Ctrl-C stops everything" in out.text(), timeout=90, step=0.1)
        assert "warning: fleet identity: Redis lost the fleet's data" in out.text()
        assert words in out.text()
        for child in ("api", "worker-1", "scheduler"):
            log = logs / f"{child}.log"
            wait_until(lambda log=log: words in log.read_text(), timeout=30, step=0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, out.text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_a_process_notices_an_identity_it_did_not_make(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis is emptied, and a process that starts then makes an identity before a
    running one looks again: the running one finds another identity than the one it
    held, records its own as lost (an error, once) and takes Redis's. A watch that held
    nothing yet takes what it finds silently (a new install looks the same)."""
    keys = Keys()
    running = IdentityWatch(redis_client, keys)
    held = running.marks().identity
    redis_client.flushdb()
    started = IdentityWatch(redis_client, keys)
    made = started.marks().identity
    assert made != held and started.marks().lost == ()
    with caplog.at_level(logging.ERROR, logger="vmpool.state.fleet_identity"):
        assert running.marks() == FleetMarks(made, {held: MarkRole.LOST})
        assert running.marks().identity == made  # held from now on: said once
    assert len(caplog.records) == 1 and held in caplog.text
    assert started.marks().lost == (held,)  # every process sees it
