"""Reconcile at scale on a cloud (the EC2 fake of tests/cloudfakes.py, in-process, real
Redis): the inventory runs no ready check, the pending checks' probes run side by side
and per pool; a handed-out VM the cloud lost is ended, as vmpooler moves it to
completed; an instance of the fleet without vmpool's launch tag ages by the cloud's
launch time and is reaped; nothing is counted destroyed that was not.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
import redis

from vmpool import lifecycle
from vmpool.config import parse_config
from vmpool.ids import Job
from vmpool.lifecycle import Fleet, RecordingDispatcher
from vmpool.providers.cloud import EC2Provider, common
from vmpool.state.names import NameGenerator
from vmpool.state.records import RequestSettings, Slot

import cloudfakes


def make_fleet(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, ready_check: str = "state"
) -> tuple[Fleet, cloudfakes.FakeCloud]:
    cloud, driver = cloudfakes.install(monkeypatch, "ec2")
    data = {
        ":providers": {"aws": {"provider_class": "ec2", "ready_check": ready_check,
                               "access_key_id": "A", "secret_access_key": "s",
                               "ssh_timeout": 0.2}},
        ":config": {"ondemand_request_ttl": 10, "reconcile_grace": 60, "timeout": 5},
        ":pools": [{"name": "p", "template": "ami-1", "provider": "aws"},
                   {"name": "q", "template": "ami-1", "provider": "aws", "ssh_port": 2222,
                    "ready_check": "ssh"}],
    }  # fmt: skip
    cfg = parse_config(data, source="test", env={})
    fleet = Fleet.build(redis_client, cfg, RecordingDispatcher(), "worker:test")
    fleet.names = NameGenerator("", random.Random(13))
    pools = {name: pool.provider_options for name, pool in cfg.pools.items()}
    fleet.providers = {"aws": EC2Provider(redis_client, fleet.keys, "aws",
                                          dict(cfg.providers["aws"].options), pools=pools,
                                          driver=driver, sleep=lambda s: None)}  # fmt: skip
    return fleet, cloud


def settle(fleet: Fleet) -> None:
    dispatch = fleet.dispatch
    assert isinstance(dispatch, RecordingDispatcher)
    while calls := dispatch.take():
        for job, subject in calls:
            getattr(lifecycle, job)(fleet, subject)


def ready(fleet: Fleet, rid: str, n: int = 1) -> None:
    settings = RequestSettings.from_config(fleet.config)
    assert fleet.store.create_request(rid, [Slot("p", "p", n)], settings, actor="t").ok
    fleet.dispatch.send(Job.PROVISION_REQUEST, [rid])
    for _ in range(5):
        settle(fleet)
        lifecycle.check_pending_sweep(fleet)
    record = fleet.store.get_request(rid)
    assert record is not None and record.status == "ready"


def test_a_handed_out_vm_the_cloud_lost_is_ended(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet, cloud = make_fleet(redis_client, monkeypatch)
    ready(fleet, "r-lost", 2)
    lost, kept = fleet.store.request_vms("r-lost")
    next(i for i in cloud.instances.values() if i.name == lost.name).state = "terminated"
    counts = lifecycle.reconcile(fleet)
    assert counts == {"running_lost": 1}
    gone = fleet.store.get_vm(lost.name)
    assert gone is not None and gone.state == "completed"
    assert gone.reason == "vanished at the provider"
    still = fleet.store.get_vm(kept.name)
    assert still is not None and still.state == "running"
    record = fleet.store.get_request("r-lost")
    assert record is not None and record.status == "ready"  # a ready request stays ready
    assert any("vanished at the provider" in e.reason for e in fleet.store.history("r-lost"))


def test_a_fleet_instance_without_the_launch_tag_is_reaped_by_its_launch_time(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The instance carries the fleet's mark and a VM name but no vmpool-created tag
    (made by hand, or by another version): it ages by EC2's launchTime (the fake says
    2026-01-01) and is destroyed past the grace; a second reconcile finds it gone and
    counts nothing destroyed."""
    fleet, cloud = make_fleet(redis_client, monkeypatch)
    provider = fleet.providers["aws"]
    assert isinstance(provider, EC2Provider)
    cloud.create(
        "stray-vm-1",
        "ami-1",
        "t3.micro",
        {"vmpool-fleet": provider.fleet_id, "vmpool-vm": "stray-vm-1"},
    )
    (seen,) = provider.inventory()
    assert seen.created_at < time.time() - 3600
    assert lifecycle.reconcile(fleet) == {"leaked_destroyed": 1}
    assert not cloud.live()
    assert lifecycle.reconcile(fleet) == {}


def test_the_inventory_runs_no_ready_check_and_probes_run_side_by_side(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten running VMs whose ssh port does not answer (each probe takes its time): the
    inventory asks none of them; one pending check probes all ten at once (each on its
    pool's port), not one after another."""
    fleet, cloud = make_fleet(redis_client, monkeypatch, ready_check="ssh")
    provider = fleet.providers["aws"]
    assert isinstance(provider, EC2Provider)
    for i in range(10):
        provider.create_vm("q", "ami-1", f"vm-{i}")
    for instance in cloud.instances.values():
        instance.state = "running"
    probing = {"now": 0, "most": 0, "ports": set()}
    lock = threading.Lock()

    def slow_probe(address: str, port: int, timeout_s: float) -> bool:
        with lock:
            probing["now"] += 1
            probing["most"] = max(probing["most"], probing["now"])
            probing["ports"].add(port)
        time.sleep(0.2)
        with lock:
            probing["now"] -= 1
        return False

    monkeypatch.setattr(common, "port_answers", slow_probe)
    inventory = provider.inventory()
    assert len(inventory) == 10 and probing["most"] == 0  # no probe at all
    seen: Any = provider.statuses([f"vm-{i}" for i in range(10)])
    assert all(vm.state == "booting" for vm in seen.values())
    assert probing["most"] == 10 and probing["ports"] == {2222}  # side by side, q's port
