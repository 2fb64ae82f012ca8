"""EC2's Query API as vmpool speaks it.

The RunInstances parameters, instances and images read from the replies, and a driver
whose errors keep the cloud's words.

libcloud's ``create_node`` cannot place an instance in a zone without a location
object, refuses security groups without a subnet, and tags the instance but not its
volumes. So the provider sends its own RunInstances (this module builds it) through
libcloud's signed connection, and reads the reply with libcloud's node parser.

Errors: EC2 answers ``<Response><Errors><Error><Code>..</Code><Message>..``. Moto (and
other endpoints) put an ``xmlns`` on it, which libcloud's parser misses, leaving a bare
``BaseHTTPError (HTTP 400)``. The driver strips any namespace from an error body first,
so ``InvalidAMIID.NotFound: The image id '[ami-x]' does not exist`` reaches the user.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vmpool.providers.cloud.nodes import Node

__all__ = [
    "Device",
    "Image",
    "driver_class",
    "images_in",
    "instances_in",
    "run_params",
    "tag_params",
]

_XMLNS = re.compile(rb'xmlns="(http://ec2\.amazonaws\.com/doc/[0-9-]+)"')
_ANY_XMLNS = re.compile(rb'\sxmlns(:\w+)?="[^"]*"')


@dataclass(frozen=True)
class Device:
    """One EBS device of an AMI: its name, the snapshot and size it starts from."""

    name: str
    snapshot: str = ""
    size: str = ""


@dataclass(frozen=True)
class Image:
    """An AMI as RunInstances needs it.

    Its id, when it was made, its EBS devices (the root first) so that every volume is
    deleted with the instance."""

    id: str
    created: str
    root_device: str
    devices: tuple[Device, ...]


def _as_bytes(body: Any) -> bytes:
    return body.encode() if isinstance(body, str) else bytes(body or b"")


def _like(body: Any, raw: bytes) -> Any:
    return raw.decode() if isinstance(body, str) else raw


def fix_xmlns(body: Any) -> Any:
    """``xmlns="http://ec2.amazonaws.com/doc/<version>"`` with the trailing ``/``."""
    return _like(body, _XMLNS.sub(rb'xmlns="\1/"', _as_bytes(body)))


def strip_xmlns(body: Any) -> Any:
    """An error body without namespaces (EC2's own errors have none)."""
    return _like(body, _ANY_XMLNS.sub(b"", _as_bytes(body)))


def driver_class(*, tolerant: bool) -> Any:
    """libcloud's EC2 driver, whose errors are read whatever their namespace.

    ``tolerant`` of an endpoint (moto's server) whose XML namespace lacks the trailing
    ``/`` libcloud's parser expects, for this driver's instances only (libcloud's
    module-wide NAMESPACE is left alone)."""
    from libcloud.compute.drivers.ec2 import EC2Connection, EC2NodeDriver, EC2Response

    class VmpoolResponse(EC2Response):  # type: ignore[misc]
        def parse_body(self) -> Any:
            if tolerant:
                self.body = fix_xmlns(getattr(self, "body", None))
            return super().parse_body()

        def parse_error(self) -> Any:
            self.body = strip_xmlns(getattr(self, "body", None))
            return super().parse_error()

    class VmpoolConnection(EC2Connection):  # type: ignore[misc]
        responseCls = VmpoolResponse

    class VmpoolEC2Driver(EC2NodeDriver):  # type: ignore[misc]
        connectionCls = VmpoolConnection

    return VmpoolEC2Driver


def tag_params(index: int, resource: str, tags: Mapping[str, str]) -> dict[str, str]:
    """One TagSpecification of RunInstances: ``resource`` gets ``tags`` at launch."""
    root = f"TagSpecification.{index}."
    params = {root + "ResourceType": resource}
    for n, (key, value) in enumerate(tags.items(), 1):
        params[f"{root}Tag.{n}.Key"] = key
        params[f"{root}Tag.{n}.Value"] = value
    return params


def run_params(
    image: Image,
    instance_type: str,
    tags: Mapping[str, str],
    client_token: str,
    placement: Mapping[str, Any],
) -> dict[str, str]:
    """RunInstances for one instance of ``image``.

    Tagged at launch with ``tags``, its volumes too (and deleted with it), placed by
    ``placement`` (the pool's settings: availability_zone, subnet_id, security_group_ids,
    key_name, user_data, iam_instance_profile, volume_size, volume_type, spot,
    spot_max_price)."""
    p = placement
    params: dict[str, str] = {
        "Action": "RunInstances",
        "ImageId": image.id,
        "MinCount": "1",
        "MaxCount": "1",
        "InstanceType": instance_type,
        "ClientToken": client_token,
    }
    optional = {
        "Placement.AvailabilityZone": p.get("availability_zone"),
        "SubnetId": p.get("subnet_id"),
        "KeyName": p.get("key_name"),
    }
    params.update({k: str(v) for k, v in optional.items() if v})
    for n, group in enumerate(p.get("security_group_ids") or (), 1):
        params[f"SecurityGroupId.{n}"] = group
    if p.get("user_data"):
        params["UserData"] = base64.b64encode(str(p["user_data"]).encode()).decode()
    profile = p.get("iam_instance_profile")
    if profile:
        kind = "Arn" if str(profile).startswith("arn:") else "Name"
        params[f"IamInstanceProfile.{kind}"] = str(profile)
    if p.get("spot"):
        params["InstanceMarketOptions.MarketType"] = "spot"
        params["InstanceMarketOptions.SpotOptions.SpotInstanceType"] = "one-time"
        params["InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior"] = "terminate"
        if p.get("spot_max_price"):
            params["InstanceMarketOptions.SpotOptions.MaxPrice"] = f"{p['spot_max_price']:g}"
    params.update(_volumes(image, p))
    params.update(tag_params(1, "instance", tags))
    params.update(tag_params(2, "volume", tags))
    return params


def _volumes(image: Image, p: Mapping[str, Any]) -> dict[str, str]:
    """Every EBS device of the image, deleted with the instance.

    Each from the image's own snapshot and size, as EC2 would. The root sized and typed
    as the pool says."""
    params: dict[str, str] = {}
    for n, device in enumerate(image.devices, 1):
        root = f"BlockDeviceMapping.{n}."
        ebs = {
            "DeleteOnTermination": "true",
            "SnapshotId": device.snapshot,
            "VolumeSize": device.size,
        }
        if device.name == image.root_device:
            ebs["VolumeSize"] = str(p.get("volume_size") or device.size)
            ebs["VolumeType"] = str(p.get("volume_type") or "")
        params[root + "DeviceName"] = device.name
        params.update({f"{root}Ebs.{k}": v for k, v in ebs.items() if v})
    return params


def instances_in(driver: Any, elements: Iterable[Any]) -> list[Node]:
    """libcloud nodes of ``instancesSet/item`` elements.

    Each carries the reason EC2 gave for its state (``stateReason``: why it stopped) in
    ``extra['state_reason']``."""
    from libcloud.compute.drivers.ec2 import NAMESPACE
    from libcloud.utils.xml import findtext

    nodes = []
    for element in elements:
        node = driver._to_node(element)
        reason = findtext(element, "stateReason/message", NAMESPACE) or ""
        code = findtext(element, "stateReason/code", NAMESPACE) or ""
        node.extra["state_reason"] = f"{code}: {reason}".strip(": ")
        nodes.append(node)
    return nodes


def images_in(reply: Any) -> list[Image]:
    """The images of a DescribeImages reply, newest first."""
    from libcloud.compute.drivers.ec2 import NAMESPACE
    from libcloud.utils.xml import findall, findtext

    found = []
    for item in findall(reply, "imagesSet/item", NAMESPACE):
        root = findtext(item, "rootDeviceName", NAMESPACE) or "/dev/xvda"
        devices = [
            Device(
                findtext(m, "deviceName", NAMESPACE) or "",
                findtext(m, "ebs/snapshotId", NAMESPACE) or "",
                findtext(m, "ebs/volumeSize", NAMESPACE) or "",
            )
            for m in findall(item, "blockDeviceMapping/item", NAMESPACE)
            if findall(m, "ebs", NAMESPACE)
        ]
        if root not in [d.name for d in devices]:
            devices.insert(0, Device(root))
        found.append(
            Image(
                id=findtext(item, "imageId", NAMESPACE) or "",
                created=findtext(item, "creationDate", NAMESPACE) or "",
                root_device=root,
                devices=tuple(d for d in devices if d.name),
            )
        )
    return sorted(found, key=lambda image: image.created, reverse=True)
