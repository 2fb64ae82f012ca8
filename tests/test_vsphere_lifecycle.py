"""The lifecycle with the vSphere provider on the in-memory vCenter (tests/vspherefake.py),
in-process against a real Redis, jobs run from a recording dispatcher (as
tests/test_cloud_lifecycle.py does for EC2).

What it proves: on-demand VMs of a vSphere pool become ready through the pending sweep
at one listing per sweep for all of them, and are destroyed in vCenter (not just powered
off) after the request is deleted; a permanent fault (NoPermission) fails the request at
once with vCenter's words; transient faults open the provider's circuit breaker, which
holds creates back, and a success closes it.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import redis

from vmpool import lifecycle
from vmpool.config import Config, parse_config
from vmpool.ids import Job
from vmpool.lifecycle import Fleet, RecordingDispatcher
from vmpool.providers.vsphere import VSphereProvider
from vmpool.state.names import NameGenerator
from vmpool.state.records import RequestSettings, Slot

from vspherefake import FakeVCenter

TEMPLATE = "templates/debian-12"


def make_config() -> Config:
    data = {
        ":providers": {"vc": {"provider_class": "vsphere", "server": "vc.example",
                              "username": "u", "password": "p", "ready_check": "state",
                              "fleet_id": "fleet-l"}},
        ":config": {"ondemand_request_ttl": 10, "max_vm_retries": 3, "timeout": 5,
                    "provider_circuit_failures": 2, "provider_circuit_cooldown": 60},
        ":pools": [{"name": "debian", "template": TEMPLATE, "provider": "vc",
                    "folder": "vmpooler/debian-12", "datastore": "ds-1",
                    "clone_target": "cluster-1"}],
    }  # fmt: skip
    return parse_config(data, source="test", env={})


@pytest.fixture
def vs_fleet(redis_client: redis.Redis) -> tuple[Fleet, FakeVCenter]:
    vc = FakeVCenter()
    config = make_config()
    fleet = Fleet.build(redis_client, config, RecordingDispatcher(), "worker:test:1")
    fleet.names = NameGenerator("", random.Random(5))
    built = fleet.providers["vc"]
    assert isinstance(built, VSphereProvider)  # the registry builds the vSphere class
    options = {**config.providers["vc"].options, "retries": 0, "backoff": 0}
    fleet.providers = {
        "vc": VSphereProvider(
            redis_client,
            fleet.keys,
            "vc",
            options,
            pools=built.pools,
            connect=vc.session,
            sleep=lambda s: None,
        )
    }
    return fleet, vc


def recorder(fleet: Fleet) -> RecordingDispatcher:
    assert isinstance(fleet.dispatch, RecordingDispatcher)
    return fleet.dispatch


def run(fleet: Fleet, skip: tuple[str, ...] = ()) -> list[tuple[str, str, Any]]:
    done = []
    for _ in range(100):
        calls = recorder(fleet).take()
        if not calls:
            return done
        for job, subject in calls:
            if job not in skip:
                done.append((job, subject, getattr(lifecycle, job)(fleet, subject)))
    raise AssertionError("dispatch did not settle")


def request(fleet: Fleet, n: int, rid: str) -> str:
    settings = RequestSettings.from_config(fleet.config)
    assert fleet.store.create_request(rid, [Slot("debian", "debian", n)], settings, actor="t").ok
    recorder(fleet).send(Job.PROVISION_REQUEST, [rid])
    return rid


def test_ready_by_the_sweep_then_destroyed_after_delete(vs_fleet: Any) -> None:
    fleet, vc = vs_fleet
    rid = request(fleet, 6, "r-vs")
    run(fleet, skip=("check_pending_vm",))
    assert len(vc.vms) == 6 and all(vm.power == "poweredOn" for vm in vc.vms.values())
    assert {vm.folder for vm in vc.vms.values()} == {"vmpooler/debian-12"}
    before = vc.calls["list_vms"]
    lifecycle.check_pending_sweep(fleet)
    assert vc.calls["list_vms"] == before + 1  # one listing for the six
    record = fleet.store.get_request(rid)
    assert record is not None and record.status == "ready"
    hostnames = fleet.store.hostnames(rid)["debian"]
    assert sorted(hostnames) == sorted(vm.name for vm in vc.vms.values())

    assert fleet.store.delete_request(rid, actor="t").ok
    run(fleet)
    lifecycle.destroy_sweep(fleet)
    run(fleet)
    assert vc.vms == {}  # destroyed in vCenter, not just powered off


def test_a_permanent_fault_fails_the_request_with_vcenters_words(vs_fleet: Any) -> None:
    fleet, vc = vs_fleet
    vc.fail("clone", "NoPermission", times=10)
    rid = request(fleet, 1, "r-denied")
    run(fleet)
    record = fleet.store.get_request(rid)
    assert record is not None and record.status == "failed"
    assert "NoPermission" in record.failure_reason
    assert vc.calls["clone"] == 1 and not fleet.circuit.is_open("vc")


def test_transient_faults_open_the_circuit_and_a_success_closes_it(vs_fleet: Any) -> None:
    fleet, vc = vs_fleet
    vc.fail("clone", "HostCommunication", times=2)
    request(fleet, 1, "r-circuit")
    outcomes = [o for job, _, o in run(fleet) if job == "create_vm"]
    assert outcomes[:3] == ["retry", "retry", "circuit_open"]
    assert fleet.circuit.is_open("vc") and vc.calls["clone"] == 2
    fleet.redis.hset(fleet.keys.provider_circuit("vc"), "open_until", "1")  # cooled down
    (held,) = [vm for vm in fleet.store.request_vms("r-circuit") if vm.state == "reserved"]
    assert lifecycle.create_vm(fleet, held.name) == "pending"
    assert not fleet.circuit.is_open("vc")
