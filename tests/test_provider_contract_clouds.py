"""The provider contract, the cloud providers' part two: the cloud's own words, quota,
per-pool placement, and instances that will never boot, on EC2, GCE and OpenStack
through libcloud's MockHttp with the in-memory clouds of tests/cloudfakes.py (each
answering in its cloud's real error shapes: EC2's XML with and without a namespace,
GCE's JSON errors and its insert operations' errors, Nova's JSON faults).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest

from vmpool.providers import PermanentProviderError, QuotaExceededError
from vmpool.providers.cloud.common import CloudProvider

from cloudfakes import EC2_NS, FakeCloud, ec2_error, gce_error
from providerhelp import Subject, mock_cloud

Setup = Callable[[FakeCloud], None]


def _fail(kind: str, status: int, body: str) -> Setup:
    return lambda cloud: cloud.fail(kind, status, body)


def _operation_error(code: str, message: str) -> Setup:
    return lambda cloud: cloud.operation_errors.append((code, message))


VCPU = "You have requested more vCPU capacity than your current vCPU limit of 32 allows"
QUOTA_ANSWERS: dict[str, tuple[str, Setup, str]] = {
    "ec2-vcpu": ("ec2", _fail("create", 400, ec2_error("VcpuLimitExceeded", VCPU)),
                 "VcpuLimitExceeded"),
    "ec2-instances-namespaced": (
        "ec2",
        _fail("create", 400, ec2_error("InstanceLimitExceeded", "Your quota allows for 0 more"
                                       " running instance(s).", xmlns=EC2_NS.rstrip("/"))),
        "InstanceLimitExceeded"),
    "ec2-capacity": ("ec2", _fail("create", 500, ec2_error(
        "InsufficientInstanceCapacity", "We currently do not have sufficient t3.micro capacity"
        " in the Availability Zone you requested (us-east-1a).")),
        "InsufficientInstanceCapacity"),
    "gce-quota": ("gce", _operation_error(
        "QUOTA_EXCEEDED", "Quota 'CPUS' exceeded.  Limit: 24.0 in region us-central1."),
        "QUOTA_EXCEEDED"),
    "gce-zone": ("gce", _operation_error(
        "ZONE_RESOURCE_POOL_EXHAUSTED", "The zone 'projects/proj/zones/us-central1-a' does not"
        " have enough resources available to fulfill the request."),
        "ZONE_RESOURCE_POOL_EXHAUSTED"),
    "nova-quota": ("openstack", _fail("create", 403, json.dumps({"forbidden": {
        "message": "Quota exceeded for cores: Requested 2, but already used 20 of 20 cores",
        "code": 403}})), "Quota exceeded for cores"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(QUOTA_ANSWERS))
def test_quota_and_capacity_are_quota_errors_not_retried(
    monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """The cloud's quota and capacity answers (each in its own shape) are quota errors,
    raised at once with the cloud's words: no retry, no wait, no instance."""
    kind, setup, words = QUOTA_ANSWERS[case]
    s = mock_cloud(monkeypatch, kind, backoff=1)
    assert s.cloud is not None
    setup(s.cloud)
    with pytest.raises(QuotaExceededError, match=words) as info:
        s.provider.create_vm("pool-1", "img-1", "vm-q")
    assert not info.value.permanent
    assert s.cloud.calls["create"] == 1 and s.slept == []
    assert not s.cloud.live()


PERMANENT: dict[str, tuple[str, Setup, str]] = {
    "ec2-type": ("ec2", _fail("create", 400, ec2_error(
        "InvalidInstanceType.NotFound", "The instance type 't9.huge' does not exist")),
        "InvalidInstanceType.NotFound: The instance type 't9.huge' does not exist"),
    "ec2-type-namespaced": ("ec2", _fail("create", 400, ec2_error(
        "InvalidParameterValue", "Value (us-east-1z) for parameter availabilityZone is invalid",
        xmlns="http://ec2.amazonaws.com/doc/2016-11-15")),
        "InvalidParameterValue: Value (us-east-1z)"),
    "gce-operation": ("gce", _operation_error(
        "RESOURCE_NOT_FOUND", "The resource 'projects/proj/zones/us-central1-a/machineTypes/"
        "e9-huge' was not found"), "RESOURCE_NOT_FOUND: The resource"),
    "gce-insert": ("gce", _fail("create", 400, gce_error(
        400, "invalid", "Invalid value for field 'resource.machineType'")),
        "Invalid value for field 'resource.machineType'"),
    "nova-flavor": ("openstack", _fail("create", 400, json.dumps({"badRequest": {
        "message": "Flavor m9.huge could not be found.", "code": 400}})),
        "Flavor m9.huge could not be found"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(PERMANENT))
def test_the_clouds_words_reach_the_error(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """A refused create raises the cloud's own code and message, whatever the XML
    namespace (EC2) and wherever the cloud says it (GCE: the insert operation's error)."""
    kind, setup, words = PERMANENT[case]
    s = mock_cloud(monkeypatch, kind)
    assert s.cloud is not None
    setup(s.cloud)
    with pytest.raises(PermanentProviderError) as info:
        s.provider.create_vm("pool-1", "img-1", "vm-p")
    assert words in str(info.value)
    assert "BaseHTTPError" not in str(info.value)


FAILED: dict[str, tuple[str, str, str]] = {
    "ec2": ("stopped", "Server.InternalError: Internal error on launch", "stopped"),
    "gce": ("stopped", "Instance failed to start: disk not found", "TERMINATED"),
    "openstack": ("error", "No valid host was found. There are not enough hosts available.",
                  "ERROR"),
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(FAILED))
def test_an_instance_that_will_never_boot_is_failed_with_the_clouds_words(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    state, fault, shown = FAILED[kind]
    s = mock_cloud(monkeypatch, kind)
    assert s.cloud is not None and isinstance(s.provider, CloudProvider)
    s.provider.create_vm("pool-1", "img-1", "vm-f")
    (instance,) = s.cloud.instances.values()
    instance.state, instance.fault = state, fault
    seen = s.provider.statuses(["vm-f"])["vm-f"]
    assert seen is not None and seen.state == "failed"
    assert fault in seen.error and shown in seen.error
    assert [vm.state for vm in s.provider.inventory()] == ["failed"]


POOLS: dict[str, dict[str, Any]] = {
    "ec2": {"instance_type": "m5.large", "zone": "us-east-1b", "subnet_id": "subnet-1",
            "security_group_ids": ["sg-1", "sg-2"], "key_name": "ci", "user_data": "#cloud-config",
            "iam_instance_profile": "vmpool-vms", "volume_size": 20, "volume_type": "gp3",
            "tags": {"team": "ci"}, "spot": True, "spot_max_price": 0.05},
    "gce": {"zone": "europe-west1-b", "machine_type": "n2-standard-4",
            "subnetwork_name": "ci-subnet", "network_name": "ci-net", "disk_type": "pd-ssd",
            "volume_size": 50, "image_family": "debian-12", "image_project": "debian-cloud",
            "service_account": "vms@proj.iam.gserviceaccount.com",
            "ssh_keys": ["ci:ssh-ed25519 AAAA ci"], "user_data": "#cloud-config",
            "tags": {"Team": "CI"}, "spot": True},
    "openstack": {"flavor": "m1.large", "zone": "nova-2", "networks": ["net-1", "net-2"],
                  "key_name": "ci", "security_groups": ["ssh"], "user_data": "#cloud-config",
                  "config_drive": True, "volume_size": 40, "tags": {"team": "ci"}},
}  # fmt: skip


def placed(monkeypatch: pytest.MonkeyPatch, kind: str, **options: Any) -> Subject:
    s = mock_cloud(monkeypatch, kind, **options)
    assert isinstance(s.provider, CloudProvider)
    provider = type(s.provider)(
        None,
        s.provider.keys,
        "cloud",
        s.provider.options.model_dump(),
        pools={"placed": POOLS[kind], "plain": {}},
        driver=s.provider.driver,
        sleep=s.slept.append,
    )
    return Subject(provider, kind, s.cloud, s.slept)


def test_ec2_places_each_pool_as_it_says(monkeypatch: pytest.MonkeyPatch) -> None:
    s = placed(monkeypatch, "ec2", tags={"owner": "ops"})
    assert s.cloud is not None
    s.provider.create_vm("placed", "ami-1", "vm-placed")
    s.provider.create_vm("plain", "ami-1", "vm-plain")
    by_name = {i.name: i.params for i in s.cloud.instances.values()}
    p = by_name["vm-placed"]
    assert p["InstanceType"] == "m5.large" and p["Placement.AvailabilityZone"] == "us-east-1b"
    assert p["SubnetId"] == "subnet-1" and p["KeyName"] == "ci"
    assert (p["SecurityGroupId.1"], p["SecurityGroupId.2"]) == ("sg-1", "sg-2")
    assert base64.b64decode(p["UserData"]) == b"#cloud-config"
    assert p["IamInstanceProfile.Name"] == "vmpool-vms"
    assert p["InstanceMarketOptions.MarketType"] == "spot"
    assert p["InstanceMarketOptions.SpotOptions.MaxPrice"] == "0.05"
    # the root volume sized and typed, every EBS volume deleted with the instance
    assert p["BlockDeviceMapping.1.DeviceName"] == "/dev/xvda"
    assert p["BlockDeviceMapping.1.Ebs.VolumeSize"] == "20"
    assert p["BlockDeviceMapping.1.Ebs.VolumeType"] == "gp3"
    assert p["BlockDeviceMapping.1.Ebs.DeleteOnTermination"] == "true"
    assert "BlockDeviceMapping.2.DeviceName" not in p  # an instance store is no EBS volume
    # instance and volumes tagged at launch: the operator's tags and vmpool's
    for spec, resource in ((1, "instance"), (2, "volume")):
        assert p[f"TagSpecification.{spec}.ResourceType"] == resource
        tags = {
            p[k]: p[k[:-3] + "Value"]
            for k in p
            if k.startswith(f"TagSpecification.{spec}.Tag.") and k.endswith(".Key")
        }
        assert tags["team"] == "ci" and tags["owner"] == "ops"
        assert tags["vmpool-vm"] == "vm-placed" and tags["vmpool-fleet"] == "fleet-a"
    plain = by_name["vm-plain"]  # the provider's defaults
    assert plain["InstanceType"] == "t3.micro" and "SubnetId" not in plain
    assert "Placement.AvailabilityZone" not in plain and "InstanceMarketOptions" not in str(plain)
    assert s.cloud.calls["image"] == 1  # one image lookup, reused


def test_gce_places_each_pool_as_it_says(monkeypatch: pytest.MonkeyPatch) -> None:
    s = placed(monkeypatch, "gce")
    assert s.cloud is not None
    s.provider.create_vm("placed", "img-1", "vm-placed")
    s.provider.create_vm("plain", "img-1", "vm-plain")
    by_name = {i.name: i for i in s.cloud.instances.values()}
    body = by_name["vm-placed"].params
    assert by_name["vm-placed"].zone == "europe-west1-b"
    assert body["machineType"] == "zones/europe-west1-b/machineTypes/n2-standard-4"
    nic = body["networkInterfaces"][0]
    assert nic["network"] == "global/networks/ci-net"
    assert nic["subnetwork"] == "regions/europe-west1/subnetworks/ci-subnet"
    disk = body["disks"][0]
    assert disk["autoDelete"] is True
    params = disk["initializeParams"]
    assert params["sourceImage"] == "projects/debian-cloud/global/images/family/debian-12"
    assert params["diskType"] == "zones/europe-west1-b/diskTypes/pd-ssd"
    assert params["diskSizeGb"] == "50" and params["labels"]["team"] == "ci"
    assert body["labels"]["team"] == "ci" and body["labels"]["vmpool-vm"] == "vm-placed"
    items = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert items == {"user-data": "#cloud-config", "ssh-keys": "ci:ssh-ed25519 AAAA ci"}
    assert body["serviceAccounts"][0]["email"] == "vms@proj.iam.gserviceaccount.com"
    assert body["scheduling"]["provisioningModel"] == "SPOT"
    plain = by_name["vm-plain"]
    assert plain.zone == "us-central1-a" and "scheduling" not in plain.params
    assert plain.params["disks"][0]["initializeParams"]["sourceImage"] == (
        "projects/proj/global/images/img-1"
    )
    # one aggregated list finds both zones' instances; destroy goes to each one's zone
    assert {vm.name for vm in s.provider.inventory()} == {"vm-placed", "vm-plain"}
    assert s.provider.destroy_vm("placed", "vm-placed") is True
    assert {vm.name for vm in s.provider.inventory()} == {"vm-plain"}


def test_openstack_places_each_pool_as_it_says(monkeypatch: pytest.MonkeyPatch) -> None:
    s = placed(monkeypatch, "openstack")
    assert s.cloud is not None
    s.provider.create_vm("placed", "img-1", "vm-placed")
    s.provider.create_vm("plain", "img-1", "vm-plain")
    by_name = {i.name: i.params for i in s.cloud.instances.values()}
    server = by_name["vm-placed"]
    assert server["flavorRef"] == "m1.large" and server["availability_zone"] == "nova-2"
    assert [n["uuid"] for n in server["networks"]] == ["net-1", "net-2"]
    assert server["key_name"] == "ci" and server["security_groups"] == [{"name": "ssh"}]
    assert base64.b64decode(server["user_data"]) == b"#cloud-config"
    assert str(server["config_drive"]) == "True"
    (volume,) = server["block_device_mapping_v2"]
    assert volume["volume_size"] == 40 and volume["delete_on_termination"] is True
    assert volume["uuid"] == "img-1" and volume["destination_type"] == "volume"
    assert server["metadata"]["team"] == "ci" and server["metadata"]["vmpool-vm"] == "vm-placed"
    plain = by_name["vm-plain"]
    assert plain["flavorRef"] == "m1.small" and "availability_zone" not in plain
    assert plain["imageRef"] == "img-1" and "block_device_mapping_v2" not in plain


IMAGE_LOOKUPS: dict[str, tuple[dict[str, Any], str]] = {
    "ec2": ({"image_filters": {"name": "ubuntu-24.04-*"}, "image_owners": ["self"]}, "ImageId"),
    "openstack": ({"image_name": "ubuntu-24.04-*"}, "imageRef"),
}


@pytest.mark.parametrize("kind", sorted(IMAGE_LOOKUPS))
def test_the_newest_matching_image_is_used(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    pool, field = IMAGE_LOOKUPS[kind]
    s = mock_cloud(monkeypatch, kind)
    assert s.cloud is not None and isinstance(s.provider, CloudProvider)
    s.cloud.images += [
        ("img-old", "ubuntu-24.04-20250101", "2025-01-01T00:00:00Z"),
        ("img-new", "ubuntu-24.04-20260301", "2026-03-01T00:00:00Z"),
        ("img-other", "debian-12-20260401", "2026-04-01T00:00:00Z"),
    ]
    provider = type(s.provider)(
        None,
        s.provider.keys,
        "cloud",
        s.provider.options.model_dump(),
        pools={"p": pool},
        driver=s.provider.driver,
    )
    provider.create_vm("p", "ignored-template", "vm-a")
    provider.create_vm("p", "ignored-template", "vm-b")
    assert {i.params[field] for i in s.cloud.instances.values()} == {"img-new"}
    assert s.cloud.calls["image"] == 1  # looked up once, then reused
    s.cloud.images.clear()
    nothing = type(s.provider)(
        None,
        s.provider.keys,
        "cloud",
        s.provider.options.model_dump(),
        pools={"p": pool},
        driver=s.provider.driver,
    )
    with pytest.raises(PermanentProviderError, match=r"ubuntu-24\.04"):
        nothing.create_vm("p", "ignored-template", "vm-c")


def test_a_bad_pool_key_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    s = mock_cloud(monkeypatch, "ec2")
    assert isinstance(s.provider, CloudProvider)
    with pytest.raises(PermanentProviderError, match=r"pools\.p\.volume_size: must be a size"):
        type(s.provider)(None, s.provider.keys, "c", {}, pools={"p": {"volume_size": "big"}})
    with pytest.raises(PermanentProviderError, match=r"pools\.p\.security_group_ids: needs a"):
        type(s.provider)(None, s.provider.keys, "c", {}, pools={"p": {"security_group_ids": ["x"]}})
