"""Amazon EC2 (and any EC2-compatible endpoint) through libcloud's EC2 connection.

A create is one RunInstances (:mod:`vmpool.providers.cloud.ec2_wire` builds it) with:

- the pool's placement (zone, subnet, security groups, instance type, key, user data,
  IAM profile, root volume, spot)
- the tags as the launch's TagSpecification for the instance and its volumes (``Name``
  set to the VM name too)
- every EBS volume deleted with the instance
- a ClientToken derived from the fleet, the request and the VM name, so EC2 itself
  answers a repeated create with the first instance.

The image is looked up once per process (DescribeImages: its devices, or the newest
image matching the pool's ``image_filters``). The fleet is listed with one
DescribeInstances filtered by ``tag:vmpool-fleet``. Requests are signed with SigV4
(right for every region and endpoint).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from vmpool.providers.base import PermanentProviderError
from vmpool.providers.cloud.aws_credentials import AwsCredentials, from_platform
from vmpool.providers.cloud.common import TAG_FLEET, TAG_REQUEST, CloudProvider
from vmpool.providers.cloud.ec2_options import EC2Options, EC2PoolOptions
from vmpool.providers.cloud.ec2_wire import (
    Image,
    driver_class,
    images_in,
    instances_in,
    run_params,
)
from vmpool.providers.cloud.nodes import Node, node_state

__all__ = ["EC2Options", "EC2PoolOptions", "EC2Provider"]

log = logging.getLogger(__name__)

# The instance states listed: a terminated instance lingers in DescribeInstances for an
# hour and is nobody's VM any more.
LIVE_STATES = ["pending", "running", "stopping", "stopped"]
# How long the newest image matching a pool's image_filters is reused before it is
# looked up again (a new image is picked up within this).
IMAGE_FILTER_TTL_S = 600.0
# Placement keys RunInstances reads from a pool's settings (ec2_wire.run_params).
PLACEMENT_KEYS = (
    "availability_zone",
    "subnet_id",
    "security_group_ids",
    "key_name",
    "user_data",
    "iam_instance_profile",
    "volume_size",
    "volume_type",
    "spot",
    "spot_max_price",
)


class EC2Provider(CloudProvider):
    options_model = EC2Options
    pool_model = EC2PoolOptions
    provider_class = "ec2"
    size_key = "instance_type"
    options: EC2Options

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._images: dict[tuple[Any, ...], tuple[float, Image]] = {}

    def credentials(self) -> tuple[str, str, str | None]:
        found = self.resolve_credentials()
        return found.key, found.secret, found.token

    def resolve_credentials(self) -> AwsCredentials:
        """The credentials: the options' keys, else the environment's, else the platform's.

        The environment's: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or ABS's names). The
        platform's: IRSA, EKS Pod Identity (aws_credentials)."""
        o = self.options
        key = o.access_key_id.get_secret_value() if o.access_key_id else None
        secret = o.secret_access_key.get_secret_value() if o.secret_access_key else None
        token = o.session_token.get_secret_value() if o.session_token else None
        env = os.environ.get
        key = key or env("AWS_ACCESS_KEY_ID") or env("ABS_AWS_ACCESS_KEY")
        secret = secret or env("AWS_SECRET_ACCESS_KEY") or env("ABS_AWS_SECRET_KEY")
        token = token or env("AWS_SESSION_TOKEN")
        if key and secret:
            return AwsCredentials(key, secret, token)
        found = from_platform(o.region, os.environ, f"vmpool-{self.name}")
        if found is None:
            raise PermanentProviderError(
                f"configuration error: provider {self.name!r} has no AWS credentials"
                " (access_key_id/secret_access_key, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY,"
                " or a web identity: AWS_ROLE_ARN with AWS_WEB_IDENTITY_TOKEN_FILE)"
            )
        return found

    def driver_kwargs(self) -> dict[str, Any]:
        """What the driver is built with, secrets aside (tests read it)."""
        kwargs: dict[str, Any] = {"region": self.options.region, "signature_version": "4"}
        if self.options.endpoint:
            parts = urlsplit(self.options.endpoint)
            secure = parts.scheme == "https"
            port = parts.port or (443 if secure else 80)
            kwargs.update(host=parts.hostname, secure=secure, port=port)
        return kwargs

    def make_driver(self) -> Any:
        found = self.resolve_credentials()
        self.driver_expires_at = found.expires_at
        if found.expires_at is not None:
            log.info("%s: AWS credentials from %s", self.name, found.source)
        cls = driver_class(tolerant=self.options.endpoint is not None)
        return cls(found.key, found.secret, token=found.token, **self.driver_kwargs())

    def query(self, params: Mapping[str, str]) -> Any:
        """One signed Query API call. Its parsed XML reply."""
        driver = self.driver
        return driver.connection.request(driver.path, params=dict(params)).object

    def launch(self, pool: str, template: str, name: str, tags: Mapping[str, str]) -> Node:
        image = self.image(pool, template)
        placement = {key: self.setting(pool, key) for key in PLACEMENT_KEYS}
        all_tags = {**self.user_tags(pool), "Name": name, **tags}
        token = self.client_token(name, tags.get(TAG_REQUEST, ""))
        params = run_params(image, self.setting(pool, "instance_type"), all_tags, token, placement)
        from libcloud.compute.drivers.ec2 import NAMESPACE
        from libcloud.utils.xml import findall

        reply = self.query(params)
        (node,) = instances_in(self.driver, findall(reply, "instancesSet/item", NAMESPACE))
        return node

    def image(self, pool: str, template: str) -> Image:
        """The image a pool's VMs start from.

        The newest matching its ``image_filters`` (looked up again after
        IMAGE_FILTER_TTL_S), else its template (looked up once)."""
        filters = self.setting(pool, "image_filters")
        owners = self.setting(pool, "image_owners") or []
        key: tuple[Any, ...] = (
            (repr(sorted(filters.items())), tuple(owners)) if filters else (template,)
        )
        cached = self._images.get(key)
        if cached and (not filters or cached[0] > time.monotonic()):
            return cached[1]
        params: dict[str, str] = {"Action": "DescribeImages"}
        if filters:
            params.update(self.driver._build_filters(filters))
            params.update({f"Owner.{n}": owner for n, owner in enumerate(owners, 1)})
        else:
            params["ImageId.1"] = template
        found = images_in(self._call("image", lambda: self.query(params)))
        if not found:
            wanted = f"images matching {filters}" if filters else f"the image id '[{template}]'"
            raise PermanentProviderError(f"InvalidAMIID.NotFound: {wanted} does not exist")
        self._images[key] = (time.monotonic() + IMAGE_FILTER_TTL_S, found[0])
        return found[0]

    def client_token(self, name: str, request_id: str = "") -> str:
        """The same token for every create of one VM of one request of one fleet.

        EC2 takes at most 64 ASCII characters. The request id keeps a name used again later
        (after its VM was terminated) from getting the old, terminated instance back."""
        seed = f"{self.fleet_id}\0{self.name}\0{name}\0{request_id}"
        digest = hashlib.sha256(seed.encode()).hexdigest()
        return f"vmpool-{digest[:48]}"

    def list_fleet(self, marks: tuple[str, ...]) -> list[Node]:
        """One DescribeInstances, filtered by the fleet tag's values ``marks``.

        libcloud's ``list_nodes`` adds a DescribeAddresses. An instance's elastic address is
        its ``ipAddress`` here already."""
        from libcloud.compute.drivers.ec2 import NAMESPACE
        from libcloud.utils.xml import findall, findtext

        filters = {f"tag:{TAG_FLEET}": list(marks), "instance-state-name": LIVE_STATES}
        params = {"Action": "DescribeInstances", **self.driver._build_filters(filters)}
        nodes: list[Node] = []
        while True:  # one page, unless EC2 answers with a NextToken
            reply = self.query(params)
            items = findall(reply, "reservationSet/item/instancesSet/item", NAMESPACE)
            nodes += instances_in(self.driver, items)
            token = findtext(reply, "nextToken", NAMESPACE)
            if not token:
                return nodes
            params = {**params, "NextToken": token}

    def size_cores(self, pool: str, size: str) -> int:
        """libcloud's table of EC2 instance types, else DescribeInstanceTypes."""
        from libcloud.compute.constants.ec2_instance_types import INSTANCE_TYPES
        from libcloud.compute.drivers.ec2 import NAMESPACE
        from libcloud.utils.xml import findtext

        known = INSTANCE_TYPES.get(size, {}).get("extra", {}).get("vcpu")
        if known:
            return int(known)
        params = {"Action": "DescribeInstanceTypes", "InstanceType.1": size}
        reply = self._call("size", lambda: self.query(params))
        vcpus = findtext(reply, "instanceTypeSet/item/vCpuInfo/defaultVCpus", NAMESPACE)
        if not vcpus:
            raise PermanentProviderError(f"InvalidInstanceType: no vCPU count for {size!r}")
        return int(vcpus)

    def tags_of(self, node: Node) -> Mapping[str, str]:
        return dict(node.extra.get("tags") or {})

    def failure(self, node: Node) -> str:
        """A stopped (or stopping) instance never turns ready by itself: EC2's reason."""
        state = node_state(node)
        if state not in ("stopped", "stopping"):
            return ""
        reason = node.extra.get("state_reason") or node.extra.get("reason") or ""
        return f"instance {node.id} {state}" + (f": {reason}" if reason else "")
