"""The lifecycle with a cloud provider (EC2 through libcloud, on the MockHttp fake of
tests/cloudfakes.py), in-process against a real Redis, jobs run from a recording
dispatcher as in tests/test_lifecycle.py.

What it proves: the pending sweep costs one list call per provider whatever the number
of pending VMs (counted at the fake cloud; the per-VM check, measured the same way,
costs one per VM, so the count tells the two apart); a ready VM gets the cloud's address
as hostname when its pool has no domain; a permanent error fails the request at once
with the cloud's message in the trail and the API's answer; the circuit breaker opens
after N consecutive transient failures, holds creates back, shows in /status and the
metrics, and closes on the next success.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from vmpool import lifecycle
from vmpool.config import Config, parse_config
from vmpool.ids import Job
from vmpool.lifecycle import Fleet, RecordingDispatcher
from vmpool.providers.cloud import EC2Provider
from vmpool.state.names import NameGenerator
from vmpool.state.records import RequestSettings, Slot

import cloudfakes
from apihelp import make_app

THROTTLED = (503, cloudfakes.ec2_error("RequestLimitExceeded", "Request limit exceeded."))


def make_config(**config: Any) -> Config:
    data = {
        ":providers": {"aws": {"provider_class": "ec2", "ready_check": "state",
                               "access_key_id": "AKID", "secret_access_key": "s"}},
        ":config": {"ondemand_request_ttl": 10, "max_vm_retries": 3, "timeout": 5,
                    "provider_circuit_failures": 2, "provider_circuit_cooldown": 60,
                    **config},
        ":pools": [
            {"name": "bare", "template": "ami-1", "provider": "aws"},
            {"name": "named", "template": "ami-1", "provider": "aws",
             "domain": "vms.example.com", "amisize": "t3.large"},
        ],
    }  # fmt: skip
    return parse_config(data, source="test", env={})


@pytest.fixture
def cloud_fleet(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> tuple[Fleet, cloudfakes.FakeCloud]:
    cloud, driver = cloudfakes.install(monkeypatch, "ec2")
    config = make_config()
    fleet = Fleet.build(redis_client, config, RecordingDispatcher(), "worker:test:1")
    fleet.names = NameGenerator("", random.Random(3))
    options = {**config.providers["aws"].options, "retries": 0, "backoff": 0}
    pools = {name: pool.provider_options for name, pool in config.pools.items()}
    fleet.providers = {
        "aws": EC2Provider(
            redis_client,
            fleet.keys,
            "aws",
            options,
            pools=pools,
            driver=driver,
            sleep=lambda s: None,
        )
    }
    return fleet, cloud


def recorder(fleet: Fleet) -> RecordingDispatcher:
    assert isinstance(fleet.dispatch, RecordingDispatcher)
    return fleet.dispatch


def run(fleet: Fleet, skip: tuple[str, ...] = ()) -> list[tuple[str, str, Any]]:
    """Run every dispatched job in-process until none is left (``skip``: jobs dropped)."""
    done = []
    for _ in range(100):
        calls = recorder(fleet).take()
        if not calls:
            return done
        for job, subject in calls:
            if job not in skip:
                done.append((job, subject, getattr(lifecycle, job)(fleet, subject)))
    raise AssertionError("dispatch did not settle")


def request(fleet: Fleet, pool: str, n: int, rid: str) -> str:
    settings = RequestSettings.from_config(fleet.config)
    assert fleet.store.create_request(rid, [Slot(pool, pool, n)], settings, actor="t").ok
    recorder(fleet).send(Job.PROVISION_REQUEST, [rid])
    return rid


def test_pending_sweep_is_one_list_call_per_provider(cloud_fleet: Any) -> None:
    fleet, cloud = cloud_fleet
    rid = request(fleet, "bare", 10, "r-batch")
    run(fleet, skip=("check_pending_vm",))  # reserve and create only
    vms = fleet.store.request_vms(rid)
    assert len(vms) == 10 and all(vm.state == "pending" for vm in vms)

    before = cloud.calls["list"]
    sweeps = 0
    while any(vm.state == "pending" for vm in fleet.store.request_vms(rid)):
        assert sweeps < 5, "the VMs never became ready"
        lifecycle.check_pending_sweep(fleet)
        sweeps += 1
    assert cloud.calls["list"] - before == sweeps  # one per sweep for all 10 VMs
    assert not any(job == "check_pending_vm" for job, _ in recorder(fleet).take())
    record = fleet.store.get_request(rid)
    assert record is not None and record.status == "ready"

    # The per-VM check costs one call per VM: the count tells the two paths apart.
    rid2 = request(fleet, "bare", 4, "r-single")
    run(fleet, skip=("check_pending_vm",))
    before = cloud.calls["list"]
    for vm in fleet.store.request_vms(rid2):
        lifecycle.check_pending_vm(fleet, vm.name)
    assert cloud.calls["list"] - before == 4


def test_a_vm_missing_from_a_fresh_list_is_booting_not_vanished(cloud_fleet: Any) -> None:
    """A cloud's list may lag its create: a VM missing from it within its list lag of
    its create stays pending (per-VM check and sweep alike); past it, it failed."""
    from vmpool.providers import StatusBatch

    grace_s = StatusBatch.list_lag_s

    fleet, cloud = cloud_fleet
    rid = request(fleet, "bare", 1, "r-lag")
    run(fleet, skip=("check_pending_vm",))
    (vm,) = fleet.store.request_vms(rid)
    for instance in cloud.instances.values():
        instance.state = "terminated"  # not listed any more
    assert lifecycle.check_pending_vm(fleet, vm.name) == "booting"
    lifecycle.check_pending_sweep(fleet)
    assert fleet.store.get_vm(vm.name).state == "pending"  # type: ignore[union-attr]
    old = fleet.store.server_time() - grace_s - 1
    fleet.redis.hset(fleet.keys.vm(vm.name), "created_at", repr(old))
    # the pending index's score is the create time too (the sweep reads only the index)
    fleet.redis.zadd(fleet.keys.pool_state(vm.pool, "pending"), {vm.name: old})
    lifecycle.check_pending_sweep(fleet)
    failed = fleet.store.get_vm(vm.name)
    assert failed is not None and failed.state == "completed"
    assert "vanished" in failed.reason


def test_hostname_is_the_clouds_address_without_a_domain(cloud_fleet: Any) -> None:
    fleet, cloud = cloud_fleet
    request(fleet, "bare", 1, "r-bare")
    request(fleet, "named", 1, "r-named")
    run(fleet)
    for _ in range(2):
        lifecycle.check_pending_sweep(fleet)
    (bare,) = fleet.store.request_vms("r-bare")
    (named,) = fleet.store.request_vms("r-named")
    assert bare.state == named.state == "running"
    address = {i.name: i.address for i in cloud.instances.values()}
    assert bare.hostname == bare.address == address[bare.name]
    assert named.hostname == f"{named.name}.vms.example.com"
    assert named.address == address[named.name]  # recorded whatever the hostname
    assert fleet.store.hostnames("r-bare") == {"bare": [address[bare.name]]}


def test_the_pools_amisize_wins_over_the_providers_instance_type(cloud_fleet: Any) -> None:
    fleet, cloud = cloud_fleet
    request(fleet, "bare", 1, "r-small")
    request(fleet, "named", 1, "r-large")
    run(fleet)
    sizes = {i.tags["vmpool-pool"]: i.size for i in cloud.instances.values()}
    assert sizes == {"bare": "t3.micro", "named": "t3.large"}


def test_permanent_error_fails_fast_with_the_clouds_message(
    cloud_fleet: Any, redis_url: str
) -> None:
    fleet, cloud = cloud_fleet
    cloud.missing_images.add("ami-1")
    rid = request(fleet, "bare", 2, "r-bad-ami")
    run(fleet)
    record = fleet.store.get_request(rid)
    assert record is not None and record.status == "failed"
    assert "InvalidAMIID.NotFound" in record.failure_reason
    assert cloud.calls["create"] <= 2  # at most once per VM: never retried
    trail = " ".join(e.reason for e in fleet.store.history(rid))
    assert "The image id '[ami-1]' does not exist" in trail
    app = make_app(fleet.config, redis_url)
    with TestClient(app) as client:
        body = client.get(f"/api/v3/ondemandvm/{rid}").json()
    assert "InvalidAMIID.NotFound" in body["reason"] and body["ready"] is False


def test_circuit_opens_holds_creates_and_closes(cloud_fleet: Any, redis_url: str) -> None:
    """Two transient failures in a row (the threshold) open the circuit: the next
    create is held back (no cloud call, the VM stays reserved); /status and /metrics
    show it; after the cool-down a create that succeeds closes it."""
    fleet, cloud = cloud_fleet
    cloud.fail("create", *THROTTLED, times=2)
    request(fleet, "bare", 1, "r-circuit")
    outcomes = [o for job, _, o in run(fleet) if job == "create_vm"]
    assert outcomes[:2] == ["retry", "retry"] and outcomes[2] == "circuit_open"
    assert cloud.calls["create"] == 2
    assert fleet.circuit.is_open("aws")
    trail = " ".join(e.reason for e in fleet.store.history("r-circuit"))
    assert "circuit open for 60s" in trail

    app = make_app(fleet.config, redis_url)
    with TestClient(app) as client:
        status = client.get("/api/v3/status").json()["providers"]["aws"]
        metrics = client.get("/metrics").text
    assert status["circuit"] == "open" and status["consecutive_failures"] == 2
    assert "RequestLimitExceeded" in status["last_error"]
    assert 'vmpool_provider_circuit_open{provider="aws"} 1.0' in metrics
    assert 'vmpool_provider_circuit_opened_total{provider="aws"} 1.0' in metrics

    # The cool-down is over (moved back in Redis): one create goes through and closes it.
    fleet.redis.hset(fleet.keys.provider_circuit("aws"), "open_until", "1")
    (held,) = [vm for vm in fleet.store.request_vms("r-circuit") if vm.state == "reserved"]
    assert lifecycle.create_vm(fleet, held.name) == "pending"
    assert not fleet.circuit.is_open("aws")
    assert fleet.circuit.states(["aws"])[0].failures == 0


def test_circuit_opens_once_for_workers_failing_together(redis_client: redis.Redis) -> None:
    """The count and the check are one script: 20 failures past the threshold open it
    once (a read-then-write breaker would open it on every failure it raced)."""
    from vmpool.state.circuit import ProviderCircuit
    from vmpool.state.keys import Keys

    circuit = ProviderCircuit(redis_client, Keys("vmpool"), threshold=3, cooldown_s=30)
    opened = [circuit.failure("aws", f"boom {i}") for i in range(20)]
    assert opened.count(True) == 1 and opened[2] is True
    assert circuit.is_open("aws") and circuit.states(["aws"])[0].opened == 1
    circuit.success("aws")
    assert not circuit.is_open("aws")


def test_a_batched_answer_older_than_a_delete_changes_nothing(cloud_fleet: Any) -> None:
    """The sweep's list is taken, then (before the sweep records anything) the request
    is deleted and its VMs released: the sweep re-reads each VM under its lock and
    attaches none of them; the released VMs go to destruction, never to 'running'."""
    fleet, cloud = cloud_fleet
    rid = request(fleet, "bare", 3, "r-raced")
    run(fleet, skip=("check_pending_vm",))
    for instance in cloud.instances.values():
        instance.state = "running"
    provider = fleet.providers["aws"]
    answer = provider.statuses

    def statuses_then_delete(names: Any) -> Any:
        seen = answer(names)  # the cloud says: all running
        assert fleet.store.delete_request(rid, actor="test").code == "deleted"
        return seen

    provider.statuses = statuses_then_delete  # type: ignore[method-assign]
    lifecycle.check_pending_sweep(fleet)
    vms = fleet.store.request_vms(rid)
    assert vms and all(vm.state == "completed" for vm in vms)
    assert all(e.dst != "running" for e in fleet.store.history(rid))


def test_an_instance_stopped_while_booting_fails_at_once_with_its_reason(
    cloud_fleet: Any,
) -> None:
    """EC2 stopped the instance (an internal error on launch): the VM fails at the next
    check, not at the pool's timeout, with EC2's words in its reason; a new VM is made."""
    fleet, cloud = cloud_fleet
    rid = request(fleet, "bare", 1, "r-stopped")
    run(fleet, skip=("check_pending_vm",))
    (instance,) = cloud.instances.values()
    instance.state, instance.fault = "stopped", "Server.InternalError: Internal error on launch"
    lifecycle.check_pending_sweep(fleet)
    (failed,) = [vm for vm in fleet.store.request_vms(rid) if vm.state == "completed"]
    assert failed.reason.startswith("failed at the provider: instance i-")
    assert "Server.InternalError: Internal error on launch" in failed.reason
    assert any(job == "provision_request" for job, _ in recorder(fleet).take())
