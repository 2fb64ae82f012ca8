"""A pool's ``dns`` section, through Libcloud's Route 53 driver, against moto's Route 53
and EC2 (one real moto process on loopback): a VM of the pool is handed out as
``name.domain`` only once that record points at its address, and the record goes when
the VM is destroyed. A pool whose zone does not exist keeps its VMs booting (never
handed out under a name that does not resolve).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import redis

from vmpool import lifecycle
from vmpool.config import parse_config, public_form
from vmpool.ids import Job
from vmpool.lifecycle import Fleet, RecordingDispatcher
from vmpool.state.names import NameGenerator
from vmpool.state.records import RequestSettings, Slot

from motohelp import MotoServer, boto_ec2

pytestmark = pytest.mark.slow


def route53(moto: MotoServer) -> Any:
    import boto3

    return boto3.client(
        "route53",
        region_name="us-east-1",
        endpoint_url=moto.url,
        aws_access_key_id="AKIDMOTO",
        aws_secret_access_key="moto-secret",
    )


def records(moto: MotoServer, zone_id: str) -> dict[str, str]:
    sets = route53(moto).list_resource_record_sets(HostedZoneId=zone_id)["ResourceRecordSets"]
    return {s["Name"]: s["ResourceRecords"][0]["Value"] for s in sets if s["Type"] == "A"}


def run(fleet: Fleet) -> None:
    dispatch = fleet.dispatch
    assert isinstance(dispatch, RecordingDispatcher)
    for _ in range(5):
        while calls := dispatch.take():
            for job, subject in calls:
                getattr(lifecycle, job)(fleet, subject)
        lifecycle.check_pending_sweep(fleet)


def test_a_pools_vms_get_and_lose_their_dns_records(
    moto: MotoServer, redis_client: redis.Redis
) -> None:
    moto.reset()
    zone = route53(moto).create_hosted_zone(Name="vms.example.com.", CallerReference="t")
    zone_id = zone["HostedZone"]["Id"]
    dns = {"driver": "route53", "endpoint": moto.url, "key": "AKIDMOTO",
           "secret": "moto-secret", "ttl": 60}  # fmt: skip
    data = {
        ":providers": {"aws": {"provider_class": "ec2", **moto.options()}},
        ":config": {"ondemand_request_ttl": 10, "timeout": 5},
        ":pools": [
            {"name": "named", "template": "ami-12c6146b", "provider": "aws",
             "domain": "vms.example.com", "dns": dns},
            {"name": "nozone", "template": "ami-12c6146b", "provider": "aws",
             "domain": "nowhere.example.org", "dns": dns},
        ],
    }  # fmt: skip
    cfg = parse_config(data, source="test", env={})
    assert public_form(cfg)["pools"][0]["provider_options"]["dns"]["secret"] == "***"
    fleet = Fleet.build(redis_client, cfg, RecordingDispatcher(), "worker:test")
    fleet.names = NameGenerator("", random.Random(17))
    settings = RequestSettings.from_config(cfg)
    for rid, pool in (("r-named", "named"), ("r-nozone", "nozone")):
        assert fleet.store.create_request(rid, [Slot(pool, pool, 1)], settings, actor="t").ok
        fleet.dispatch.send(Job.PROVISION_REQUEST, [rid])
    run(fleet)

    record = fleet.store.get_request("r-named")
    assert record is not None and record.status == "ready"
    (vm,) = fleet.store.request_vms("r-named")
    assert vm.hostname == f"{vm.name}.vms.example.com"
    (instance,) = [
        i
        for r in boto_ec2(moto).describe_instances()["Reservations"]
        for i in r["Instances"]
        if {"Key": "vmpool-vm", "Value": vm.name} in i.get("Tags", [])
    ]
    assert records(moto, zone_id) == {f"{vm.name}.vms.example.com.": instance["PublicIpAddress"]}

    stuck = fleet.store.get_request("r-nozone")
    assert stuck is not None and stuck.status == "pending"  # no zone: not handed out
    assert [v.state for v in fleet.store.request_vms("r-nozone")] == ["pending"]

    assert fleet.store.delete_request("r-named", actor="t").ok
    lifecycle.destroy_sweep(fleet)
    run(fleet)
    assert fleet.store.get_vm(vm.name).state == "destroyed"  # type: ignore[union-attr]
    assert records(moto, zone_id) == {}
