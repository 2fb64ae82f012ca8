"""Amazon EC2 (and any EC2-compatible endpoint) through libcloud's EC2 driver.

Tags go out as the launch's TagSpecification (libcloud's ``ex_metadata``), with
``Name`` set to the VM name too; the fleet is listed with one DescribeInstances filtered
by ``tag:vmpool-fleet``; every RunInstances carries a ClientToken derived from the fleet,
the request and the VM name, so EC2 itself answers a repeated create with the first instance.
Requests are signed with SigV4 (right for every region and endpoint).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from vmpool.providers.base import PermanentProviderError
from vmpool.providers.cloud.aws_credentials import AwsCredentials, from_platform
from vmpool.providers.cloud.common import (
    TAG_FLEET,
    TAG_REQUEST,
    CloudOptions,
    CloudProvider,
    Node,
    Secret,
)

__all__ = ["EC2Options", "EC2Provider"]

log = logging.getLogger(__name__)

# The instance states listed: a terminated instance lingers in DescribeInstances for an
# hour and is nobody's VM any more.
LIVE_STATES = ["pending", "running", "stopping", "stopped"]


class EC2Options(CloudOptions):
    """``provider_class: ec2``. Credentials: the options, else AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) from the environment, else the pod's
    role (IRSA or EKS Pod Identity: :mod:`vmpool.providers.cloud.aws_credentials`)."""

    region: str = Field("us-east-1", description="The AWS region")
    endpoint: str | None = Field(
        None, description="An EC2-compatible endpoint URL (default: the region's)"
    )
    access_key_id: Secret | None = Field(None, description="Access key id (secret)")
    secret_access_key: Secret | None = Field(None, description="Secret access key (secret)")
    session_token: Secret | None = Field(None, description="Session token (secret)")
    instance_type: str = Field("t3.micro", description="The instance type (vmpooler: amisize)")
    subnet_id: str | None = Field(None, description="The subnet instances start in")
    security_group_ids: list[str] = Field(default_factory=list, description="Security groups")
    key_name: str | None = Field(None, description="The key pair installed on instances")
    user_data: str | None = Field(None, description="cloud-init user data")

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"endpoint must be an http(s) URL, got {value!r}")
        return value


class EC2Provider(CloudProvider):
    options_model = EC2Options
    provider_class = "ec2"
    options: EC2Options

    def credentials(self) -> tuple[str, str, str | None]:
        found = self.resolve_credentials()
        return found.key, found.secret, found.token

    def resolve_credentials(self) -> AwsCredentials:
        """The options' keys, else AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, else the
        platform's (IRSA, EKS Pod Identity: aws_credentials.from_platform)."""
        o = self.options
        key = o.access_key_id.get_secret_value() if o.access_key_id else None
        secret = o.secret_access_key.get_secret_value() if o.secret_access_key else None
        token = o.session_token.get_secret_value() if o.session_token else None
        key = key or os.environ.get("AWS_ACCESS_KEY_ID")
        secret = secret or os.environ.get("AWS_SECRET_ACCESS_KEY")
        token = token or os.environ.get("AWS_SESSION_TOKEN")
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
        driver_class = _driver_class(tolerant=self.options.endpoint is not None)
        return driver_class(found.key, found.secret, token=found.token, **self.driver_kwargs())

    def launch(
        self, pool: str, template: str, name: str, tags: Mapping[str, str], size: str | None
    ) -> Node:
        from libcloud.compute.base import NodeImage, NodeSize

        o = self.options
        kind = size or o.instance_type
        node_size = NodeSize(kind, kind, 0, 0, 0, 0, self.driver)
        kwargs: dict[str, Any] = {
            "ex_metadata": {"Name": name, **tags},
            "ex_clienttoken": self.client_token(name, tags.get(TAG_REQUEST, "")),
        }
        if o.subnet_id:
            kwargs["ex_subnet"] = _Subnet(o.subnet_id)
        if o.security_group_ids:
            kwargs["ex_security_group_ids"] = list(o.security_group_ids)
        if o.key_name:
            kwargs["ex_keyname"] = o.key_name
        if o.user_data:
            kwargs["ex_userdata"] = o.user_data
        image = NodeImage(template, template, self.driver)
        return self.driver.create_node(name=name, size=node_size, image=image, **kwargs)

    def client_token(self, name: str, request_id: str = "") -> str:
        """The same token for every create of one VM of one request of one fleet (EC2:
        at most 64 ASCII); the request id keeps a name used again later (after its VM
        was terminated) from getting the old, terminated instance back."""
        seed = f"{self.fleet_id}\0{self.name}\0{name}\0{request_id}"
        digest = hashlib.sha256(seed.encode()).hexdigest()
        return f"vmpool-{digest[:48]}"

    def list_fleet(self) -> list[Node]:
        """One DescribeInstances (libcloud's ``list_nodes`` adds a DescribeAddresses;
        an instance's elastic address is its ``ipAddress`` here already)."""
        from libcloud.compute.drivers.ec2 import NAMESPACE
        from libcloud.utils.xml import findall, findtext

        filters = {f"tag:{TAG_FLEET}": self.fleet_id, "instance-state-name": LIVE_STATES}
        driver = self.driver
        params = {"Action": "DescribeInstances", **driver._build_filters(filters)}
        nodes: list[Node] = []
        while True:  # one page, unless EC2 answers with a NextToken
            reply = driver.connection.request(driver.path, params=params).object
            for reservation in findall(reply, "reservationSet/item", NAMESPACE):
                nodes += driver._to_nodes(reservation, "instancesSet/item")
            token = findtext(reply, "nextToken", NAMESPACE)
            if not token:
                return nodes
            params = {**params, "NextToken": token}

    def tags_of(self, node: Node) -> Mapping[str, str]:
        return dict(node.extra.get("tags") or {})


class _Subnet:
    """What libcloud's ``ex_subnet`` reads of an EC2NetworkSubnet: its id."""

    def __init__(self, subnet_id: str) -> None:
        self.id = subnet_id


_XMLNS = re.compile(rb'xmlns="(http://ec2\.amazonaws\.com/doc/[0-9-]+)"')


def _fix_xmlns(body: Any) -> Any:
    """``xmlns="http://ec2.amazonaws.com/doc/<version>"`` with the trailing ``/``."""
    raw = body.encode() if isinstance(body, str) else bytes(body or b"")
    fixed = _XMLNS.sub(rb'xmlns="\1/"', raw)
    return fixed.decode() if isinstance(body, str) else fixed


def _driver_class(*, tolerant: bool) -> Any:
    """libcloud's EC2 driver; ``tolerant`` of an endpoint (moto's server) whose XML
    namespace lacks the trailing ``/`` libcloud's parser expects, for this driver's
    instances only (libcloud's module-wide NAMESPACE is left alone)."""
    from libcloud.compute.drivers.ec2 import EC2Connection, EC2NodeDriver, EC2Response

    if not tolerant:
        return EC2NodeDriver

    class TolerantResponse(EC2Response):  # type: ignore[misc]
        def parse_body(self) -> Any:
            self.body = _fix_xmlns(getattr(self, "body", None))
            return super().parse_body()

    class TolerantConnection(EC2Connection):  # type: ignore[misc]
        responseCls = TolerantResponse

    class TolerantEC2Driver(EC2NodeDriver):  # type: ignore[misc]
        connectionCls = TolerantConnection

    return TolerantEC2Driver
