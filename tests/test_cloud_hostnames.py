"""Every hostname the API hands out works everywhere in the API, on moto's EC2 server
(a real process on loopback) with the lifecycle run in-process against a real Redis.

A pool with no ``domain`` hands out the cloud's address: an on-demand request's
hostname and a warm checkout's are both the instance's address, recorded with the VM's
ready transition (warm VMs too) and indexed, so ``GET/PUT/DELETE /vm/<address>`` find
the VM; ``GET /vm/<hostname>`` shows the address as ``ip``. A pool with a domain hands
out ``name.domain``: the FQDN and the bare name both work.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from vmpool import lifecycle
from vmpool.config import parse_config
from vmpool.ids import Job
from vmpool.lifecycle import Fleet, RecordingDispatcher
from vmpool.state.names import NameGenerator
from vmpool.state.records import RequestSettings, Slot

from apihelp import make_app
from motohelp import MotoServer, boto_ec2

pytestmark = pytest.mark.slow


def settle(fleet: Fleet) -> None:
    dispatch = fleet.dispatch
    assert isinstance(dispatch, RecordingDispatcher)
    for _ in range(100):
        calls = dispatch.take()
        if not calls:
            return
        for job, subject in calls:
            getattr(lifecycle, job)(fleet, subject)
    raise AssertionError("dispatch did not settle")


def boot(fleet: Fleet) -> None:
    """Jobs and pending sweeps until nothing is booting any more."""
    for _ in range(20):
        settle(fleet)
        counts = fleet.store.pool_counts(fleet.config.pools)
        if not any(c["reserved"] + c["pending"] for c in counts.values()):
            return
        lifecycle.check_pending_sweep(fleet)
    raise AssertionError("VMs never booted")


@pytest.fixture
def moto_fleet(moto: MotoServer, redis_client: redis.Redis) -> Fleet:
    moto.reset()
    data = {
        ":providers": {"aws": {"provider_class": "ec2", **moto.options()}},
        ":config": {"ondemand_request_ttl": 10, "timeout": 5},
        ":pools": [
            {"name": "bare", "template": "ami-12c6146b", "provider": "aws"},
            {"name": "warm", "template": "ami-12c6146b", "provider": "aws", "size": 1},
            {"name": "named", "template": "ami-12c6146b", "provider": "aws",
             "domain": "vms.example.com"},
        ],
    }  # fmt: skip
    config = parse_config(data, source="test", env={})
    fleet = Fleet.build(redis_client, config, RecordingDispatcher(), "worker:test")
    fleet.names = NameGenerator("", random.Random(5))
    return fleet


def public_addresses(moto: MotoServer) -> dict[str, str]:
    """VM name -> the public address moto gave its instance."""
    found = {}
    for reservation in boto_ec2(moto).describe_instances()["Reservations"]:
        for i in reservation["Instances"]:
            tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
            if "vmpool-vm" in tags and i["State"]["Name"] == "running":
                found[tags["vmpool-vm"]] = i["PublicIpAddress"]
    return found


def works_everywhere(client: TestClient, hostname: str, name: str, ip: str) -> None:
    """GET shows the VM (with its address), PUT changes it, DELETE gives it back."""
    got = client.get(f"/api/v3/vm/{hostname}")
    assert got.status_code == 200, (hostname, got.json())
    assert got.json()[name]["ip"] == ip
    put = client.put(f"/api/v3/vm/{hostname}", json={"lifetime": 3, "tags": {"a": "b"}})
    assert put.status_code == 200, (hostname, put.json())
    assert client.get(f"/api/v3/vm/{hostname}").json()[name]["tags"] == {"a": "b"}
    assert client.delete(f"/api/v3/vm/{hostname}").status_code == 200


def test_handed_out_hostnames_work_with_every_vm_endpoint(
    moto_fleet: Fleet, moto: MotoServer, redis_url: str
) -> None:
    fleet = moto_fleet
    settings = RequestSettings.from_config(fleet.config)
    for rid, pool in (("r-bare", "bare"), ("r-named", "named")):
        assert fleet.store.create_request(rid, [Slot(pool, pool, 1)], settings, actor="t").ok
        fleet.dispatch.send(Job.PROVISION_REQUEST, [rid])
    lifecycle.top_up_pools(fleet)
    boot(fleet)
    addresses = public_addresses(moto)
    assert len(set(addresses.values())) == 3

    (bare,) = fleet.store.request_vms("r-bare")
    (named,) = fleet.store.request_vms("r-named")
    (warm,) = fleet.store.pool_vms("warm", "ready")
    assert fleet.store.get_vm(warm).address == addresses[warm]  # type: ignore[union-attr]

    with TestClient(make_app(fleet.config, redis_url)) as client:
        handed = client.get("/api/v3/ondemandvm/r-bare").json()["bare"]["hostname"]
        assert handed == [addresses[bare.name]]
        checkout = client.post("/api/v3/vm/warm").json()
        assert checkout == {"ok": True, "warm": {"hostname": addresses[warm]}}
        fqdn = client.get("/api/v3/ondemandvm/r-named").json()["named"]["hostname"][0]
        assert fqdn == f"{named.name}.vms.example.com"

        works_everywhere(client, addresses[bare.name], bare.name, addresses[bare.name])
        works_everywhere(client, addresses[warm], warm, addresses[warm])
        for hostname in (fqdn, named.name):
            assert (
                client.get(f"/api/v3/vm/{hostname}").json()[named.name]["ip"]
                == (addresses[named.name])
            )
        works_everywhere(client, fqdn, named.name, addresses[named.name])
        assert client.get("/api/v3/vm/192.0.2.77").status_code == 404
        assert client.get("/api/v3/vm/2001:db8::1").status_code == 404


def test_a_destroyed_vm_leaves_the_address_index(moto_fleet: Fleet, moto: MotoServer) -> None:
    fleet = moto_fleet
    lifecycle.top_up_pools(fleet)
    boot(fleet)
    (warm,) = fleet.store.pool_vms("warm", "ready")
    address = public_addresses(moto)[warm]
    assert fleet.store.vm_at_address(address) == warm
    checkout: Any = fleet.store.pools.checkout(
        {"warm": 1}, owner="", owner_hash="", lifetime_s=60, actor="t"
    )
    assert checkout.ok
    assert fleet.store.pools.give_back(warm, actor="t").ok
    lifecycle.destroy_sweep(fleet)
    settle(fleet)
    record = fleet.store.get_vm(warm)
    assert record is not None and record.state == "destroyed"
    assert fleet.store.vm_at_address(address) is None
