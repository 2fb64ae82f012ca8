"""EC2 on moto's server (a real process on loopback, its AMI and instance-type
validation on): a pool's subnet and availability zone are where its instance lands,
with the pool's instance type, its volumes tagged and deleted on termination; a missing
AMI or instance type fails the request at once with EC2's own code in its reason.
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
from vmpool.providers import PermanentProviderError
from vmpool.providers.cloud import EC2Provider
from vmpool.state.keys import Keys
from vmpool.state.names import NameGenerator
from vmpool.state.records import RequestSettings, Slot

from apihelp import make_app
from motohelp import MotoServer, boto_ec2

pytestmark = pytest.mark.slow
AMI = "ami-12c6146b"  # one of moto's own images


def a_subnet(moto: MotoServer, zone: str) -> tuple[str, str]:
    """A new subnet in ``zone`` of a new VPC, and a security group of that VPC."""
    ec2 = boto_ec2(moto)
    vpc = ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.20.1.0/24", AvailabilityZone=zone)
    group = ec2.create_security_group(GroupName="ci", Description="ci", VpcId=vpc)
    return subnet["Subnet"]["SubnetId"], group["GroupId"]


def test_the_pools_subnet_and_zone_are_where_the_instance_lands(moto: MotoServer) -> None:
    moto.reset()
    subnet, group = a_subnet(moto, "us-east-1c")
    pools = {"placed": {"subnet_id": subnet, "availability_zone": "us-east-1c",
                        "security_group_ids": [group], "instance_type": "t3.small",
                        "volume_size": 12, "tags": {"team": "ci"}}}  # fmt: skip
    provider = EC2Provider(None, Keys(), "aws", moto.options(fleet_id="f1"), pools=pools)
    provider.create_vm("placed", AMI, "vm-placed")
    provider.create_vm("plain", AMI, "vm-plain")
    ec2 = boto_ec2(moto)
    found = {}
    for reservation in ec2.describe_instances()["Reservations"]:
        for i in reservation["Instances"]:
            tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
            found[tags["vmpool-vm"]] = i
    placed, plain = found["vm-placed"], found["vm-plain"]
    assert placed["SubnetId"] == subnet
    assert placed["Placement"]["AvailabilityZone"] == "us-east-1c"
    assert placed["InstanceType"] == "t3.small"
    assert [g["GroupId"] for g in placed["SecurityGroups"]] == [group]
    assert plain["InstanceType"] == "t3.micro" and plain.get("SubnetId") != subnet
    (mapping,) = placed["BlockDeviceMappings"]
    volume = ec2.describe_volumes(VolumeIds=[mapping["Ebs"]["VolumeId"]])["Volumes"][0]
    assert volume["Size"] == 12 and mapping["Ebs"]["DeleteOnTermination"] is True
    tags = {t["Key"]: t["Value"] for t in volume.get("Tags", [])}
    assert tags["team"] == "ci" and tags["vmpool-vm"] == "vm-placed"  # a leaked one is found
    assert tags["vmpool-fleet"] == "f1"


def test_a_missing_instance_type_says_so_in_ec2s_words(moto: MotoServer) -> None:
    moto.reset()
    pools = {"big": {"instance_type": "t9.colossal"}}
    provider = EC2Provider(None, Keys(), "aws", moto.options(fleet_id="f1"), pools=pools)
    with pytest.raises(PermanentProviderError) as info:
        provider.create_vm("big", AMI, "vm-big")
    assert "InvalidInstanceType" in str(info.value) and "t9.colossal" in str(info.value)


def test_a_missing_ami_fails_the_request_fast_with_invalid_ami_id(
    moto: MotoServer, redis_client: redis.Redis, redis_url: str
) -> None:
    moto.reset()
    data = {
        ":providers": {"aws": {"provider_class": "ec2", **moto.options()}},
        ":config": {"ondemand_request_ttl": 10, "max_vm_retries": 3},
        ":pools": [{"name": "gone", "template": "ami-00000000deadbeef", "provider": "aws"}],
    }
    cfg = parse_config(data, source="test", env={})
    fleet = Fleet.build(redis_client, cfg, RecordingDispatcher(), "worker:test")
    fleet.names = NameGenerator("", random.Random(9))
    settings = RequestSettings.from_config(cfg)
    assert fleet.store.create_request("r-gone", [Slot("gone", "gone", 1)], settings,
                                      actor="t").ok  # fmt: skip
    fleet.dispatch.send(Job.PROVISION_REQUEST, ["r-gone"])
    outcomes: list[Any] = []
    dispatch = fleet.dispatch
    assert isinstance(dispatch, RecordingDispatcher)
    while calls := dispatch.take():
        outcomes += [(job, getattr(lifecycle, job)(fleet, subject)) for job, subject in calls]
    assert ("create_vm", "request_failed") in outcomes  # the first create, no retry
    with TestClient(make_app(cfg, redis_url)) as client:
        body = client.get("/api/v3/ondemandvm/r-gone").json()
    assert body["ready"] is False and "InvalidAMIID" in body["reason"]
    assert "ami-00000000deadbeef" in body["reason"]
    assert body["message"].startswith("The request failed: Configuration error")
