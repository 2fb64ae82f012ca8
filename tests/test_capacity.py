"""A provider's own limits, ``max_instances`` and ``max_cores``, counted from the fleet's
VMs: vmpool stops asking before the cloud says no, and the VMs that do not fit wait
reserved (no retry spent) until one of the provider's VMs is gone.

The lifecycle runs in-process on the EC2 fake (tests/cloudfakes.py) against a real
Redis; the admission script is driven by racing threads.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
import redis

from vmpool import lifecycle
from vmpool.config import parse_config
from vmpool.ids import Job
from vmpool.lifecycle import Fleet, RecordingDispatcher
from vmpool.providers.cloud import EC2Provider
from vmpool.state.capacity import Limits, ProviderCapacity
from vmpool.state.keys import Keys
from vmpool.state.names import NameGenerator
from vmpool.state.records import RequestSettings, Slot

import cloudfakes


def make_fleet(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, **limits: Any
) -> tuple[Fleet, cloudfakes.FakeCloud]:
    cloud, driver = cloudfakes.install(monkeypatch, "ec2")
    data = {
        ":providers": {"aws": {"provider_class": "ec2", "ready_check": "state",
                               "access_key_id": "A", "secret_access_key": "s", **limits}},
        ":config": {"ondemand_request_ttl": 10, "max_vm_retries": 1, "timeout": 5},
        ":pools": [{"name": "small", "template": "ami-1", "provider": "aws"},
                   {"name": "large", "template": "ami-1", "provider": "aws",
                    "instance_type": "m5.xlarge"}],
    }  # fmt: skip
    cfg = parse_config(data, source="test", env={})
    fleet = Fleet.build(redis_client, cfg, RecordingDispatcher(), "worker:test")
    fleet.names = NameGenerator("", random.Random(11))
    pools = {name: pool.provider_options for name, pool in cfg.pools.items()}
    options = {**cfg.providers["aws"].options, "retries": 0}
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


def settle(fleet: Fleet) -> list[tuple[str, str, Any]]:
    dispatch = fleet.dispatch
    assert isinstance(dispatch, RecordingDispatcher)
    done = []
    while calls := dispatch.take():
        done += [(job, s, getattr(lifecycle, job)(fleet, s)) for job, s in calls]
    return done


def request(fleet: Fleet, rid: str, pool: str, n: int) -> None:
    settings = RequestSettings.from_config(fleet.config)
    assert fleet.store.create_request(rid, [Slot(pool, pool, n)], settings, actor="t").ok
    fleet.dispatch.send(Job.PROVISION_REQUEST, [rid])


def make_due(fleet: Fleet) -> None:
    """The waiting reservations past the sweep's grace (so it may dispatch them)."""
    for pool in fleet.config.pools:
        for name in fleet.store.pool_vms(pool, "reserved"):
            fleet.redis.zadd(fleet.keys.pool_state(pool, "reserved"), {name: 1})


def test_max_instances_holds_the_rest_back_until_a_vm_is_gone(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet, cloud = make_fleet(redis_client, monkeypatch, max_instances=2)
    request(fleet, "r-two", "small", 2)
    request(fleet, "r-waits", "small", 1)
    outcomes = sorted(o for job, _, o in settle(fleet) if job == "create_vm")
    assert outcomes == ["pending", "pending", "quota"]
    assert cloud.calls["create"] == 2  # the cloud was never asked for the third
    (waiting,) = fleet.store.request_vms("r-waits")
    assert waiting.state == "reserved" and "max_instances 2" in waiting.error
    record = fleet.store.get_request("r-waits")
    assert record is not None and record.retries == 0

    make_due(fleet)
    lifecycle.check_pending_sweep(fleet)  # still full: its create is not dispatched
    assert not [j for j, _, _ in settle(fleet) if j == "create_vm"]

    # the first request goes, its VMs are destroyed: the waiting create goes through
    assert fleet.store.delete_request("r-two", actor="t").ok
    lifecycle.destroy_sweep(fleet)
    settle(fleet)
    make_due(fleet)
    lifecycle.check_pending_sweep(fleet)
    assert [o for j, _, o in settle(fleet) if j == "create_vm"] == ["pending"]
    assert [i.tags["vmpool-request"] for i in cloud.live()] == ["r-waits"]


def test_max_cores_counts_each_pools_instance_type(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """t3.micro has 2 vCPUs, m5.xlarge 4 (libcloud's table): with max_cores 6, one
    large and one small fit, a second small does not."""
    fleet, cloud = make_fleet(redis_client, monkeypatch, max_cores=6)
    request(fleet, "r-large", "large", 1)
    settle(fleet)
    request(fleet, "r-small", "small", 2)
    outcomes = sorted(o for job, _, o in settle(fleet) if job == "create_vm")
    assert outcomes == ["pending", "quota"]
    assert sorted(i.size for i in cloud.live()) == ["m5.xlarge", "t3.micro"]
    (waiting,) = [vm for vm in fleet.store.request_vms("r-small") if vm.state == "reserved"]
    assert "6 cores of max_cores 6" in waiting.error


def test_racing_admissions_never_exceed_the_limit(redis_client: redis.Redis) -> None:
    """20 workers claim a place at once (a barrier), the limit is 5: exactly 5 are
    admitted. The count and the claim are one script; a count read before a claim
    written apart would let every racer see room."""
    capacity = ProviderCapacity(redis_client, Keys("vmpool"), lease_s=60)
    limits = Limits(max_instances=5, max_cores=0, pool_cores={"p": 1})
    barrier = threading.Barrier(20)
    admitted: list[bool] = []

    def claim(i: int) -> None:
        barrier.wait(10)
        admitted.append(capacity.admit("aws", "p", f"vm-{i}", limits)[0])

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert admitted.count(True) == 5 and len(admitted) == 20
    assert not capacity.admit("aws", "p", "vm-late", limits)[0]
    launching = Keys("vmpool").provider_launching("aws")
    held = [m.split("|")[1] for m in redis_client.zrange(launching, 0, -1)]
    assert capacity.admit("aws", "p", held[0], limits)[0]  # a claim held is renewed
    capacity.release("aws", "p", held[0])
    assert capacity.admit("aws", "p", "vm-late", limits)[0]  # the place it freed
