"""Quota is a third kind of failure: the VM waits reserved, no retry spent, and the
request is served when capacity frees, within its TTL.

On moto (a real process on loopback) behind a loopback proxy that answers the first N
RunInstances with EC2's ``VcpuLimitExceeded``: the request turns ready after the N
refusals, with none of its retries spent and the circuit breaker untouched. On the EC2
fake: while the provider's creates wait, the pending sweep dispatches none of them
(the cloud is not asked again); a request whose TTL runs out while it waits fails with
the cloud's words as its last cause, in its GET; the wait shows in ``GET /status``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
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
from motohelp import FaultProxy, MotoServer

VCPU_LIMIT = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error>'
    "<Code>VcpuLimitExceeded</Code><Message>You have requested more vCPU capacity than"
    " your current vCPU limit of 32 allows for the instance bucket that the specified"
    " instance type belongs to.</Message></Error></Errors><RequestID>r-1</RequestID></Response>"
)


def config(provider: dict[str, Any], ttl_minutes: float = 10) -> Config:
    data = {
        ":providers": {"aws": {"provider_class": "ec2", **provider}},
        ":config": {"ondemand_request_ttl": ttl_minutes, "timeout": 5, "max_vm_retries": 1,
                    "provider_quota_wait": 1, "provider_circuit_failures": 1},
        ":pools": [{"name": "ubuntu", "template": "ami-12c6146b", "provider": "aws"}],
    }  # fmt: skip
    return parse_config(data, source="test", env={})


def settle(fleet: Fleet) -> list[tuple[str, str, Any]]:
    dispatch = fleet.dispatch
    assert isinstance(dispatch, RecordingDispatcher)
    done = []
    for _ in range(100):
        calls = dispatch.take()
        if not calls:
            return done
        for job, subject in calls:
            done.append((job, subject, getattr(lifecycle, job)(fleet, subject)))
    raise AssertionError("dispatch did not settle")


def request(fleet: Fleet, rid: str) -> None:
    settings = RequestSettings.from_config(fleet.config)
    assert fleet.store.create_request(rid, [Slot("ubuntu", "ubuntu", 1)], settings, actor="t").ok
    fleet.dispatch.send(Job.PROVISION_REQUEST, [rid])


def make_fleet(client: redis.Redis, cfg: Config) -> Fleet:
    fleet = Fleet.build(client, cfg, RecordingDispatcher(), "worker:test")
    fleet.names = NameGenerator("", random.Random(7))
    return fleet


@pytest.fixture
def proxy(moto: MotoServer) -> Iterator[FaultProxy]:
    moto.reset()
    fault = FaultProxy(moto.url, "RunInstances", 3, 400, VCPU_LIMIT).start()
    try:
        yield fault
    finally:
        fault.stop()


@pytest.mark.slow
def test_quota_errors_then_success_the_request_turns_ready(
    proxy: FaultProxy, moto: MotoServer, redis_client: redis.Redis
) -> None:
    fleet = make_fleet(redis_client, config(moto.options(endpoint=proxy.url)))
    request(fleet, "r-quota")
    outcomes: list[str] = []
    deadline = time.monotonic() + 30
    while fleet.store.get_request("r-quota").status == "pending":  # type: ignore[union-attr]
        assert time.monotonic() < deadline, f"never ready; creates: {outcomes}"
        outcomes += [o for job, _, o in settle(fleet) if job == "create_vm"]
        # the reservations wait past the sweep's grace: make them due at once
        for name in fleet.store.pool_vms("ubuntu", "reserved"):
            fleet.redis.zadd(fleet.keys.pool_state("ubuntu", "reserved"), {name: 1})
        lifecycle.check_pending_sweep(fleet)
        time.sleep(0.2)
    record = fleet.store.get_request("r-quota")
    assert record is not None and record.status == "ready"
    assert proxy.refused == 3 and outcomes.count("quota") == 3, outcomes
    assert record.retries == 0  # no retry spent: max_vm_retries is 1
    assert not fleet.circuit.is_open("aws")  # quota is not the cloud's health
    (vm,) = fleet.store.request_vms("r-quota")
    assert vm.state == "running" and vm.attempt == 1  # the first VM, never failed


@pytest.fixture
def fake_fleet(redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> Any:
    cloud, driver = cloudfakes.install(monkeypatch, "ec2")
    cfg = config(
        {"ready_check": "state", "access_key_id": "A", "secret_access_key": "s"}, ttl_minutes=0.05
    )
    fleet = make_fleet(redis_client, cfg)
    options = {**cfg.providers["aws"].options, "retries": 0, "backoff": 0}
    fleet.providers = {
        "aws": EC2Provider(
            redis_client, fleet.keys, "aws", options, driver=driver, sleep=lambda s: None
        )
    }
    return fleet, cloud


@pytest.mark.slow
def test_waiting_vms_are_not_asked_for_and_the_ttl_names_the_quota(
    fake_fleet: Any, redis_url: str
) -> None:
    fleet, cloud = fake_fleet
    cloud.fail("create", 400, VCPU_LIMIT, times=100)
    request(fleet, "r-wait")
    request(fleet, "r-wait-2")
    outcomes = [o for job, _, o in settle(fleet) if job == "create_vm"]
    assert outcomes == ["quota", "quota"]  # the second one held back without a call
    assert cloud.calls["create"] == 1
    for name in fleet.store.pool_vms("ubuntu", "reserved"):
        fleet.redis.zadd(fleet.keys.pool_state("ubuntu", "reserved"), {name: 1})
    lifecycle.check_pending_sweep(fleet)
    assert recorder_calls(fleet) == []  # the quota wait holds: nothing dispatched
    (waiting,) = fleet.store.request_vms("r-wait")
    assert waiting.state == "reserved" and "VcpuLimitExceeded" in waiting.error

    with TestClient(make_app(fleet.config, redis_url)) as client:
        status = client.get("/api/v3/status").json()["providers"]["aws"]
        assert status["quota"] == "held" and status["quota_held_total"] == 1
        assert "VcpuLimitExceeded" in status["quota_error"]
        assert status["circuit"] == "closed" and status["consecutive_failures"] == 0
        metrics = client.get("/metrics").text
        assert 'vmpool_provider_quota_held{provider="aws"} 1.0' in metrics
        assert 'vmpool_provider_quota_holds_total{provider="aws"} 1.0' in metrics
        deadline = time.monotonic() + 10
        while fleet.store.expire_request("r-wait", actor="t").code != "failed":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        body = client.get("/api/v3/ondemandvm/r-wait").json()
    assert body["message"].startswith("The request failed to provision instances within")
    assert "last cause: waiting for capacity at provider aws" in body["reason"]
    assert "VcpuLimitExceeded" in body["reason"]


def recorder_calls(fleet: Fleet) -> list[tuple[str, str]]:
    assert isinstance(fleet.dispatch, RecordingDispatcher)
    return fleet.dispatch.take()
